"""The shape of the simulated Ray cluster the session's ``ray_cluster`` fixture starts."""

NODES, GPUS_PER_NODE = 3, 4
