"""File formats, read and written: Hugging Face model directories (hf.py), GGUF files (gguf.py),
hub names (hub.py), tokenizers (tokenizer.py), chat templates (chat_template.py), and the one error
a loader raises for a file it cannot use (errors.py)."""
