"""The roles on a Ray cluster: actor, critic and reference as groups of Ray actors placed by placement
groups (one bundle per trainer GPU; roles colocated in a bundle share its GPU), data parallel through
DeepSpeed inside each group. All Ray calls of the trainer live in this package."""
