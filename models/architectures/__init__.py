"""Model definitions: one decoder (decoder.py) and its two families, GPT-2 (gpt.py) and the Llama
family (llama.py), each family file mapping its Hugging Face names explicitly. The encoder and the
encoder-decoder are defined beside their CLIs (models.encoder, models.seq2seq)."""
