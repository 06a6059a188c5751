#!/bin/bash
# Build cuda_extension from binding.cpp and kernels/, with the elapsed time.
START_TIME=$(date +%s.%N)
python3 -m utils.compile
EXIT_CODE=$?
END_TIME=$(date +%s.%N)
echo "[TIME] Compilation took $(awk "BEGIN {printf \"%.2f\", $END_TIME - $START_TIME}")s"
exit $EXIT_CODE
