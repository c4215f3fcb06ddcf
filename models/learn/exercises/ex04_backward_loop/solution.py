"""Exercise 4: the reference solution."""


def topological_order(root):
    """Tensors of root's graph, each after every tensor that consumes it (root first)."""
    order, visited = [], set()

    def visit(t):
        if id(t) in visited:
            return
        visited.add(id(t))
        if t.op is not None:
            for parent in t.op.inputs:
                visit(parent)
        order.append(t)  # after its inputs: post-order

    visit(root)
    return order[::-1]


def run_backward(root, grad):
    # notes 10.2: from the output back to the leaves; a tensor used twice receives the sum
    pending = {id(root): grad}
    for t in topological_order(root):
        g = pending.pop(id(t), None)
        if g is None:
            continue
        if t.op is None:  # a leaf: accumulate into .grad (+=: gradients of two passes add)
            t.grad = g if t.grad is None else t.grad + g
            continue
        for parent, parent_grad in zip(t.op.inputs, t.op.backward(g), strict=True):
            if parent_grad is None or not parent.requires_grad:
                continue
            key = id(parent)
            pending[key] = pending[key] + parent_grad if key in pending else parent_grad
