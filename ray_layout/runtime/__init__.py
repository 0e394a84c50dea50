"""Runs on a Ray cluster: placement of a run's ranks on multi-node placement groups in Megatron's
rank order, one actor per rank running a launcher, heartbeats, failure classes, cancellation and
cleanup on every path, and profiling runs whose results land in the cost store. The imperative
shell around the measurement core."""
