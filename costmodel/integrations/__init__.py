"""Hooks into training stacks: argparse flags (`args`), a per-step check that every rank
holds the same schedule (`agree`), a recorder of each rank's timed steps for `costmodel
correct` (`runs`), and drop-ins shaped like the schedulers RL frameworks
already call (`slime`, `verl`). Import the submodule you need; nothing here imports torch
until a function that needs torch.distributed is called."""
