"""The search: every layout Megatron accepts, Megatron's 1F1B and interleaved schedules simulated
with blocking p2p (and as a max-plus recurrence for speed), memory per stage, bounds and a branch
and bound that proves the optimum under the cost model, exact ties collapsed, and the planner
that ranks layouts against the config's current layout, Megatron's default and the count-based
rule. Pure: no Ray, no files; a caller may run its shards anywhere through ``map_shards``."""
