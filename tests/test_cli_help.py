"""Every command line's --help opens with a whole sentence: the module docstring's first paragraph
(a description cut at the docstring's first line break ends mid-sentence)."""

import importlib

import pytest

CLIS = [
    "models.chat", "models.train", "models.sample", "models.lora", "models.lab",
    "models.learn.__main__", "models.worked_example", "models.finetune_demo", "models.encoder",
    "models.seq2seq", "models.evaluate", "models.gradient_penalty", "models.newton",
    "benchmarks.__main__", "benchmarks.llm", "benchmarks.finetune", "benchmarks.products",
    "benchmarks.autodiff_modes", "benchmarks.ddp", "benchmarks.quant_quality",
    "benchmarks.train_worker",
]  # fmt: skip


@pytest.mark.parametrize("module", CLIS)
def test_help_describes_the_command_in_whole_sentences(module, capsys):
    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(module).main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    description = text.split("\n\n")[1]  # usage, then the description, then the options
    assert not description.startswith(("options:", "positional arguments:")), module
    assert description.rstrip().endswith("."), f"{module}: {description!r}"
