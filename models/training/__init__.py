"""Training: the one loop and what it is made of. Read in this order:

config.py       TrainConfig: every setting with its type, default and help; the command line
step.py         train_step, the one optimizer step, run eagerly or compiled
task.py         Task: what a task plugs in (data, model, loss, metrics)
loop.py         Trainer: the run (steps, evaluations, checkpoints, --resume, Ctrl-C, --ddp)
checkpoints.py  the run's files and reading them back; adapt.py --freeze, --lora-rank
plot.py         loss.png
tasks/          the plug-ins: language.py and chat.py (the GPT/Llama decoder), masked.py (the
                encoder's masked characters), digits.py (the encoder-decoder's digit tasks)
"""
