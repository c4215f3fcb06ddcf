"""The decoder's tasks: language modelling on a corpus (language.py) and chat fine-tuning on
conversations (chat.py, --sft). The encoder's and the encoder-decoder's tasks live beside their
models (models/encoder.py, models/seq2seq.py)."""
