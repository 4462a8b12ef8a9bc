"""Support modules: what is not the algorithm, kept apart so that each trainer reads top to bottom.

Trainers (cifar_fpo.py, robot_fpo.py) and their variants import from here; nothing here imports a trainer or a
tool (halving.py, diagnostics.py). Where a component runs a trainer (fpo_utils/arms.py), the trainer's entry point
is passed in.

- run bookkeeping: runfolder, settings, devices, robot_bookkeeping, cifar_metrics
- models and environments: unet (the image generator), envs, env_layout, playground_env
- the fast paths' pieces: cifar_graphs, samplers, graphs, flow_triton, mlp_layers
- the tools' components: arms (runs as Ray tasks), grids (cells and tables), replay (numpy only), gram, heatmaps
"""
