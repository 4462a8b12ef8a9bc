"""Support modules of the trainers that are not the algorithm (the run folder, models, fast paths,
environment adapters), kept apart so that each trainer reads top to bottom."""
