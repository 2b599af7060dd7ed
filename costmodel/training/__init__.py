"""A small reference trainer that uses the scheduler in real data-parallel training.

`costmodel.training` holds the parts behind `examples/train_varlen.py` (the `torchrun`
entry), `costmodel train-demo` and `costmodel bench-schedule`:

- `data`: synthetic RL-like variable-length batches and lengths files (numpy only);
- `config`: the trainer's flags, their validation and the per-step schedule plan
  (numpy only: every check runs before any process group exists);
- `model`: a tiny GPT built from `costmodel.kernels.layer.TransformerLayer` (torch);
- `trainer`: the per-rank training loop over torch.distributed (torch);
- `launch`: a multiprocessing launcher for `costmodel train-demo` (torch, lazily);
- `bench`: `bench-schedule`'s policies, measurement loop and report (torch only in the
  GPU measurer).

Importing this package imports neither torch nor triton.
"""
