"""Hooks into training stacks: argparse flags (`args`), and drop-ins shaped like the
schedulers RL frameworks already call (`slime`, `verl`). Import the submodule you need;
nothing here imports torch."""
