"""The megatron-core backend: each rank trains megatron-core's own GPTModel on the CPU (gloo),
with megatron-core's schedule, DDP, optimizer and timers, on a logical clock of CPU times."""
