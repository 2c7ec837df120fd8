"""One attempt of a built-in or protocol workload: the training loop and what it stands on.

    trainer      the loop: resolve the device, resume, train, report, checkpoint
    window       the reporting window: the loss kept on the device, training time, the ETA's costs
    cadence      when to checkpoint: the preset's interval, or the one that loses least ('auto')
    restore      resume from the newest checkpoint that loads
    failures     what goes wrong in the trainer, and the exit code and event that say so
    data         the engine-owned sample order (resume by samples seen)
    distributed  torchrun/DDP: the world, its launcher, stop agreement
    faults       fault injection inside the trainer: real failures on any machine
    sampling     text generation from a checkpoint (`cockpit sample`)
"""
