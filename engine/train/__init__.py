"""One attempt of a built-in or protocol workload: the training loop and what it stands on.

    trainer      the loop: resolve the device, resume, train, report, checkpoint
    checkpoint   atomic checkpoints, the last K kept
    data         the engine-owned sample order (resume by samples seen)
    device       device, precision and autocast resolved once; device memory figures
    distributed  torchrun/DDP: the world, its launcher, stop agreement
    sampling     text generation from a checkpoint (`cockpit sample`)
"""
