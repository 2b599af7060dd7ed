"""Calibration: sweep plans, timers, fitting, the FLOPs check, validation and reports.

    plan.py       which points to time, budgeted to the time allowed
    timer.py      CUDA-event timer, the `Timer` protocol, a synthetic timer for tests
    workloads.py  the GPU workloads (kernels' attention, layer and head) behind each point
    fit.py        per-call/per-sequence separation, monotone curves, residuals (scipy)
    check.py      achieved FLOP/s of every point vs the GPU's peak
    device.py     device fingerprint, `--gpu` check, missing torch/CUDA errors
    pipeline.py   calibrate(): sweep -> fit -> check -> CostModel
    validate.py   predicted vs measured on random packed micro-batches
    correct.py    factors per part fitted to runs measured end to end (`costmodel correct`)
    runs_file.py  the runs file those runs come in (no scipy: training processes write it)
    report.py     table and plot

Importing this package (and every module but workloads.py) needs numpy/scipy only;
torch is imported when a CUDA timer is built.
"""
