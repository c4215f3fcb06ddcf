"""glassgrad's models: the GPT (models.gpt), its tokenizer and data, and the train/sample CLIs.

>>> from models import GPT, GPTConfig
>>> model = GPT(GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=2, n_embd=32))
>>> [name for name, _ in model.named_parameters()][:2]
['transformer.wte.weight', 'transformer.wpe.weight']
"""

from autograd import check_packages  # nn, imported by models.gpt, checks autograd
from models.gpt import GPT, GPTConfig
from models.tokenizer import BPETokenizer, CharTokenizer

__all__ = ["GPT", "BPETokenizer", "CharTokenizer", "GPTConfig"]

check_packages("nn", "models")  # no folder of the same name may shadow glassgrad's
