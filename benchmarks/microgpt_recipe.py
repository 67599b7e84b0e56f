"""The two ways docs/microgpt.md runs Karpathy's microgpt.py on pygrad, as
edits of the gist's text (bench_microgpt.py applies them to your copy):

- ``strict_swap``: its ``class Value`` block becomes ``from pygrad import
  Value``; nothing else changes.
- ``apply_recipe``: the swap, then the compiled recipe: 2 changed lines in
  the model (an embedding lookup and the softmax's max shift) and the
  training loop written with ``pygrad.per_length`` and ``optim.Adam``.

Each edit names the exact lines it replaces, and fails with a message if
they are not in the file (another version of the gist).
"""

SWAP = "from pygrad import Value\n\n"

MODEL_EDITS = [
    ("    tok_emb = state_dict['wte'][token_id] # token embedding\n",
     "    tok_emb = pygrad.embed(state_dict['wte'], token_id) # token embedding\n"),
    ("    max_val = max(val.data for val in logits)\n",
     "    max_val = pygrad.detached_max(logits)\n"),
]

# The training loop: from its first line to its last (the step's print).
LOOP_FIRST = "m = [0.0] * len(params) # first moment buffer\n"
LOOP_LAST_PREFIX = '    print(f"step {step+1:4d} / {num_steps:4d} | loss '

COMPILED_LOOP = '''\
num_steps = 1000 # number of training steps
adam = pygrad.optim.Adam(params, lr=lambda t: learning_rate * (1 - t / num_steps),
                         betas=(beta1, beta2), eps=eps_adam)
def doc_loss(tokens): # one document's loss, compiled once per length
    n = len(tokens) - 1
    keys, values = [[] for _ in range(n_layer)], [[] for _ in range(n_layer)]
    losses = []
    for pos_id in range(n):
        token_id, target_id = tokens[pos_id], tokens[pos_id + 1]
        logits = gpt(token_id, pos_id, keys, values)
        probs = softmax(logits)
        losses.append(-pygrad.pick(probs, target_id).log())
    return (1 / n) * sum(losses)
train = pygrad.per_length(doc_loss, vocab_size, adam)
for step in range(num_steps):
    doc = docs[step % len(docs)]
    tokens = [BOS] + [uchars.index(ch) for ch in doc] + [BOS]
    n = min(block_size, len(tokens) - 1)
    loss = train.step(tokens[:n + 1]) # forward, backward and Adam, in C
'''


def _cut(src: str, start: str, end: str) -> "tuple[int, int]":
    i = src.find(start)
    j = src.find(end, i)
    if i < 0 or j < 0:
        raise ValueError(f"not the microgpt.py this recipe knows: no {start.strip()!r} ... "
                         f"{end.strip()!r} block")
    return i, j


def strict_swap(src: str) -> str:
    """microgpt.py with its Value class replaced by pygrad's."""
    i, j = _cut(src, "class Value:", "# Initialize the parameters")
    return src[:i] + SWAP + src[j:]


def apply_recipe(src: str) -> str:
    """microgpt.py with the swap and the compiled recipe (docs/microgpt.md)."""
    out = strict_swap(src).replace(SWAP, "from pygrad import Value\nimport pygrad\n\n", 1)
    for old, new in MODEL_EDITS:
        if old not in out:
            raise ValueError(f"not the microgpt.py this recipe knows: no line {old.strip()!r}")
        out = out.replace(old, new, 1)
    i, j = _cut(out, LOOP_FIRST, LOOP_LAST_PREFIX)
    # the step's print stays, printing the float train.step returns
    k = out.index("\n", j) + 1
    printed = out[j:k].replace("loss.data", "loss")
    between = out[i:j]
    steps_line = next((line for line in between.splitlines(True)
                       if line.startswith("num_steps = ")), None)
    if steps_line is None:
        raise ValueError("not the microgpt.py this recipe knows: no num_steps line")
    loop = COMPILED_LOOP.replace("num_steps = 1000 # number of training steps\n", steps_line, 1)
    return out[:i] + loop + printed + out[k:]
