"""The local control plane: Go-built Kubernetes binaries and a kwokctl-driven cluster on 127.0.0.1."""
