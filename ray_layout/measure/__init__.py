"""What a cluster measured: Megatron's log formats read and written, each log checked against
what its run was declared to be, the Parquet cost store, logs ingested into it, and the fit that
turns per-rank timers into unit costs, with the profile design that chooses which layouts to run
so every unit's cost is identifiable. It uses the simulator (``search``) to fit what only a whole
step shows: transfer latency and the step tail."""
