"""Embedded training text for the tiny tokenizer: no downloads, same bytes on every machine.

A few real paragraphs give natural merges; sentences generated from a fixed word list with a
fixed-seed PRNG add enough material for ~770 merges (vocab 1024 = 256 bytes + specials + merges).
"""

from __future__ import annotations

import random

_PARAGRAPHS = """\
Tensor-parallel serving spreads every layer of a language model over several servers. Each
decoding step ends with an all-reduce of the hidden state, so the network sits on the critical
path of every token. When one cable or network card fails, the collective library stops, the
engine dies, and every request in flight fails with it.
A resilient communicator stripes each transfer over all healthy rails. A rail that dies in the
middle of a collective has its unacknowledged chunks sent again on the survivors, so nothing is
lost and the result is bit for bit the same. An operator can drain a rail, watch its health, and
bring it back without restarting the server.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How
vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow.
User: What is the capital of France?
Assistant: The capital of France is Paris.
User: Count from one to ten.
Assistant: one, two, three, four, five, six, seven, eight, nine, ten.
def all_reduce(tensor, group):
    for rank in range(group.size()):
        tensor += receive(rank)
    return tensor
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 32 64 128 256 512 1024 2048 4096
"""

_WORDS = (
    "the a an one two three rail rails network card server servers token tokens model layer "
    "layers request requests latency bandwidth chunk chunks send receive reduce gather scatter "
    "broadcast rank ranks world group fault faults failure recover recovery healthy degraded "
    "drain failover probe weight weights schedule ring direct optimal bound tail median fast "
    "slow large small every each all none some is are was were has have will can must not and "
    "or but with over under into from to of in on at by for while when after before then again "
    "red green blue cold warm bright dark quiet loud river mountain city garden window morning "
    "evening paper music story question answer number time day night year people world water"
).split()


_SYLLABLES = "ka lo mi ne ru sa ti vo zen pra tor qua bel dri fen gol hux jin yor wex".split()


def _word(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.7:
        return rng.choice(_WORDS)
    if r < 0.9:  # made-up words: enough distinct pairs to fill the whole vocabulary with merges
        return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
    return str(rng.randint(0, 99999))


def training_text(n_sentences: int = 4000) -> list[str]:
    """The corpus as a list of lines (deterministic: fixed text plus a fixed-seed generator)."""
    rng = random.Random(1234)  # independent of the model seed: the tokenizer never changes
    lines = _PARAGRAPHS.splitlines()
    for _ in range(n_sentences):
        words = [_word(rng) for _ in range(rng.randint(4, 14))]
        words[0] = words[0].capitalize()
        lines.append(" ".join(words) + rng.choice(".!?,;:"))
    return lines
