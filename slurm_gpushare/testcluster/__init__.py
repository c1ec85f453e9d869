"""The dockerized Slurm test cluster (docker/): compose services from the policy, and its lifecycle."""
