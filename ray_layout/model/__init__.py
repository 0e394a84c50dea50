"""What a run is: the model and its parallel sizes (from a project YAML/JSON, a Megatron command
line or launch script, or a Hugging Face config), their parameters, FLOPs and memory per layout
unit, Megatron's layout language and its baselines, and the unit costs the search reads. Pure
functions over frozen dataclasses; no Ray, no files beyond the inputs it is handed."""
