"""Model definitions: one decoder (decoder.py) and its two families, GPT-2 (gpt.py) and the Llama
family (llama.py), each family file mapping its Hugging Face names explicitly; the encoder-only
Transformer (encoder.py) and the encoder-decoder with its digit vocabulary (seq2seq.py)."""
