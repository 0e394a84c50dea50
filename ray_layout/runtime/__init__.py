"""Runs on a Ray cluster: placement of a run's ranks on multi-node placement groups in Megatron's
rank order, one actor per rank running a launcher, heartbeats, failure classes, cancellation and
cleanup on every path; each rank parses its own output and sends it back through Ray, and the
driver alone writes the cost store. Also the search's shards as Ray tasks. The imperative shell
around the measurement core."""
