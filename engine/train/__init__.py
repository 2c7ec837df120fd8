"""One attempt of a built-in or protocol workload: the training loop and what it stands on.

    trainer      the loop: resolve the device, resume, train, report, checkpoint
    data         the engine-owned sample order (resume by samples seen)
    distributed  torchrun/DDP: the world, its launcher, stop agreement
    faults       fault injection inside the trainer: real failures on any machine
    sampling     text generation from a checkpoint (`cockpit sample`)
"""
