"""Training: the one loop and what it is made of. Read in this order:

config.py       TrainConfig: every setting with its type, default and help; the command line
step.py         train_step, the one optimizer step, run eagerly or compiled
task.py         Task: what a task plugs in (data, model, loss, metrics)
loop.py         Trainer: the run (steps, evaluations, checkpoints, --resume, Ctrl-C, --ddp)
checkpoints.py  the run's files and reading them back; adapt.py --freeze, --lora-rank
plot.py         loss.png
tasks/          language modelling and chat fine-tuning with the GPT/Llama decoder
"""
