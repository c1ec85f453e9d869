"""The static planner: demand model, candidate policies (layouts, modes, weights, routes), their packing score on
the Slurm placement model (sim/), the plan report. Pure."""
