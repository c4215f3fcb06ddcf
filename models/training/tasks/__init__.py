"""The tasks of the loop: the decoder's language modelling on a corpus (language.py) and chat
fine-tuning on conversations (chat.py, --sft); the encoder's masked characters (masked.py); the
encoder-decoder's digit tasks (digits.py)."""
