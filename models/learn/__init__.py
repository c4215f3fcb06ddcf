"""Learn autodiff by rebuilding it: a graded exercise track in English and Chinese.

`python -m models.learn start DIR` writes one file per exercise (the notes' order: unbroadcast,
matmul, elementwise ops and reductions, the backward loop, softmax, cross-entropy, layernorm,
embedding, attention, AdamW); `check DIR N` plugs the learner's functions into the engine in
place of glassgrad's own (models/learn/plug.py) and grades them with autograd.testing.check_op,
naming the classic mistake when it recognises one (models/learn/grader.py). Each exercise is one
folder of models/learn/exercises/ (its text, stub, solution, cases, diagnoses). docs/learn.md
walks the track.
"""
