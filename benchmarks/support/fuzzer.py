"""A seeded generator of hostile rules files, shared by ``tests/test_hostile_input.py``
(a short run in CI) and ``benchmarks/fuzz_rules.py`` (a long one).

:func:`cases` yields ``(kind, bytes)`` from one ``random.Random(seed)``, so a failure is
reproduced from its seed and index alone. Three kinds, in turn:

- ``generated``: a rules file built from the format's own vocabulary (every top-level
  field, every rule field, expressions assembled from attributes, operators, literals
  and units), with values of every type, sizes and numbers at and past their limits;
- ``mutated``: a seed file (valid and invalid cases, examples) with byte- and line-level
  mutations (YAML punctuation, tags, anchors, binary bytes, deleted or swapped lines);
- ``spliced``: lines of two seed files or generated files interleaved.

Among the values: integers PyYAML builds in quadratic time (YAML 1.1 sexagesimal
``1:1:1:...``, long hex and decimal), chains of anchors whose aliases share references
(:func:`shared_aliases`), and facts whose annotations are shared references standing for
a million values (:data:`TASKS`).

Nothing here decides what the result should be; the callers check it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

from amm_rules.language.diagnostics import Diagnostic
from amm_rules.language.loader import check_text
from amm_rules.language.ruleset import Ruleset, TaskFacts, WorkerFacts

ROOT = Path(__file__).resolve().parents[2]


def seed_files() -> list[bytes]:
    """Every rules file the project ships as a case or an example."""
    paths = sorted((ROOT / "tests" / "cases").glob("*/*.yaml"))
    paths += sorted((ROOT / "examples" / "rules").glob("*.yaml"))
    return [p.read_bytes() for p in paths]


TASK_ATTRIBUTES = [
    "task.key",
    "task.prefix",
    "task.group",
    "task.type",
    "task.nbytes",
    "task.replicas",
    "task.annotations.tier",
    "task.annotations['x-y']",
    'task.annotations["a"]',
    "task.annotations",
    "task.nope",
    "worker.host",
]
WORKER_ATTRIBUTES = [
    "worker.resources.GPU",
    "worker.memory_limit",
    "worker.memory",
    "worker.memory_fraction",
    "worker.nthreads",
    "worker.host",
    "worker.name",
    "worker.address",
    "worker.resources",
    "task.key",
]
OPERATORS = ["==", "!=", "<", "<=", ">", ">=", "in", "matches", "not in", "=", "=>", "~"]
LITERALS = [
    '"stage1"',
    "'x-*'",
    '"*a*a*a*a*a*a*a*a*a*b"',
    '"[a-z]*[!0-9]?"',
    '"[z-a]"',
    '"["',
    '"\\u00e9"',
    '"\\x"',
    "1",
    "-1",
    "0",
    "1.5",
    "1e999",
    "10 GiB",
    "64GiB",
    "3 parsecs",
    "30%",
    "150%",
    "true",
    "false",
    "null",
    '["a", "b"]',
    "[1, 2, 3]",
    "[]",
    "[[1]]",
    "9" * 40,
]

RULE_FIELDS = ["name", "match", "replicate", "pool", "avoid", "spread", "move", "comment"]
TOP_FIELDS = [
    "version",
    "pools",
    "rules",
    "rebalance",
    "reduce-replicas",
    "reload-settle",
    "anchors",
    "extra",
]
REBALANCE_FIELDS = [
    "enabled",
    "measure",
    "sender-min",
    "recipient-max",
    "gap",
    "max-bytes-per-cycle",
    "match",
    "cool-down",
    "copy-timeout",
    "drop-timeout",
    "bogus",
]
SCALARS = [
    "1",
    "0",
    "-3",
    "2.0",
    "2.5",
    ".nan",
    ".inf",
    "-.inf",
    "1e308",
    "99999999999999999999999999",
    "10001",
    "true",
    "no",
    "null",
    "~",
    '""',
    "''",
    "host",
    "none",
    "never",
    "allowed",
    "gpu",
    "[gpu, spot]",
    "[]",
    "{}",
    "{min: 2}",
    "{min: 3, max: 2}",
    "{max: 0}",
    "{min: .nan}",
    "{least: 1}",
    "30%",
    "1 GiB",
    "0 B",
    "30s",
    "-1s",
    "500 ms",
    "2001-01-01",
    "0x1F",
    "0o17",
    "1_000",
    "!!str 3",
    "!!int x",
    "!!float 1",
    "!!python/object/apply:os.system [echo]",
    "!!binary aGk=",
    "&anchor 3",
    "*anchor",
    "1:" * 3_000 + "1",
    "1:30:59",
    "0x" + "f" * 4_500,
    "-0b" + "1" * 5_000,
    "9" * 5_000,
    "1_0" * 60,
    "|\n      literal",
    ">-\n      folded",
]
TOKENS = [
    b":",
    b": ",
    b"- ",
    b"[",
    b"]",
    b"{",
    b"}",
    b",",
    b"'",
    b'"',
    b"|",
    b">",
    b"#",
    b"\t",
    b"\n",
    b"\r",
    b"\r\n",
    b"  ",
    b"&a ",
    b"*a",
    b"&b [*a, *a, *a] ",
    b"1:" * 2_000 + b"1",
    b"0x" + b"f" * 4_500,
    b"!!python/object:os.system ",
    b"!!python/name:builtins.eval ",
    b"!custom ",
    b"!!str ",
    b"!!int ",
    b"!!set ",
    b"<<: ",
    b"---\n",
    b"...\n",
    b"%YAML 1.1\n",
    b"%TAG ! tag:yaml.org,2002:python/\n",
    b"\x00",
    b"\xff",
    b"\xc3",
    b"\x07",
    b"\x1b[31m",
    b"\xe2\x80\xa8",
    b"\xef\xbb\xbf",
    b"\\",
    b"\\u",
    b"\\x4",
    b"~",
    b"1e999",
    b".nan",
    b"-1",
    b"10000000000",
    b"task.",
    b"worker.",
    b"((",
    b"))",
    b"==",
    b"not ",
    b" and ",
    b" or ",
    b" matches ",
    b"GiB",
    b"%",
    b"version: 1\n",
    b"rules:\n",
    b"pools:\n",
    b"rebalance:\n",
    b"replicate: ",
    b"pool: ",
    b"avoid: ",
    b"match: ",
    b"- name: x\n",
]


def expression(rng: random.Random, attributes: list[str], depth: int = 0) -> str:
    """A random expression, mostly well-formed, sometimes not."""
    roll = rng.random()
    if depth < 4 and roll < 0.25:
        op = rng.choice([" and ", " or ", " and not ", " or ", " AND ", " && "])
        left = expression(rng, attributes, depth + 1)
        right = expression(rng, attributes, depth + 1)
        return f"{left}{op}{right}"
    if depth < 4 and roll < 0.35:
        return f"not ({expression(rng, attributes, depth + 1)})"
    if roll < 0.38:
        return "(" * rng.choice([1, 10, 70]) + rng.choice(attributes) + ")" * rng.randint(0, 70)
    if roll < 0.40:
        return "not " * rng.choice([2, 70]) + rng.choice(attributes)
    if roll < 0.42:
        return " or ".join(f"{rng.choice(attributes)} == {i}" for i in range(rng.choice([3, 700])))
    if roll < 0.44:
        return rng.choice(attributes)
    return f"{rng.choice(attributes)} {rng.choice(OPERATORS)} {rng.choice(LITERALS)}"


def quoted(rng: random.Random, text: str) -> str:
    """``text`` as a YAML scalar: plain, single- or double-quoted, or a block."""
    style = rng.random()
    if style < 0.4:
        return text
    if style < 0.7:
        return "'" + text.replace("'", "''") + "'"
    if style < 0.9:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return ">-\n      " + text


#: Values a rule field takes in a file that has a chance to be valid.
TAME = {
    "replicate": ["1", "2", "3", "{min: 2}", "{min: 1, max: 4}", "{max: 3}"],
    "pool": ["gpu", "[gpu, spot]", "spot"],
    "avoid": ["spot", "[big]"],
    "spread": ["host", "none"],
    "move": ["never", "allowed"],
}
#: attribute -> comparisons that type-check (``op literal``).
TAME_TASK = {
    "task.key": ['matches "x-*"', 'matches "[a-z]*?"', '== "x-1"', 'in ["a", "b"]'],
    "task.prefix": ['== "stage1"', 'in ["a", "b"]', 'not in ["c"]', 'matches "*a*a*b"'],
    "task.nbytes": ["> 10 MiB", ">= 0", "< 1 GiB"],
    "task.replicas": [">= 2", "== 0"],
    "task.annotations.tier": ['== "gold"', "> 3", "== true", 'in ["a", 1]'],
}
TAME_WORKER = {
    "worker.resources.GPU": [">= 1", "> 0.5"],
    "worker.memory_limit": [">= 64 GiB", "< 1 MiB"],
    "worker.memory_fraction": ["< 30%", "> 0.5"],
    "worker.host": ['matches "10.0.0.*"', 'in ["a", "b"]'],
    "worker.nthreads": ["> 4"],
}


def tame_expression(rng: random.Random, vocabulary: dict[str, list[str]]) -> str:
    parts = []
    for _ in range(rng.randint(1, 3)):
        attribute = rng.choice(list(vocabulary))
        negate = "not " if rng.random() < 0.2 else ""
        parts.append(f"{negate}{attribute} {rng.choice(vocabulary[attribute])}")
    return rng.choice([" and ", " or "]).join(parts)


def generated(rng: random.Random) -> bytes:
    """A rules file from the format's vocabulary: half the time with values a valid
    file could hold (so that checking goes deep), else with values of any type."""
    if rng.random() < 0.5:
        return _tame(rng)
    lines: list[str] = []
    for field in rng.sample(TOP_FIELDS, rng.randint(1, len(TOP_FIELDS))):
        if field == "version":
            lines.append(f"version: {rng.choice(['1', '1', '1', '2', '1.0', 'one', '[1]'])}")
        elif field == "pools":
            lines.append("pools:")
            for i in range(rng.randint(0, 4)):
                name = rng.choice(["gpu", "spot", "big", f"p{i}", "9bad", "a b", "x" * 70])
                lines.append(f"  {name}: {quoted(rng, expression(rng, WORKER_ATTRIBUTES))}")
        elif field == "rules":
            lines.append("rules:")
            for i in range(rng.randint(0, 5)):
                fields = rng.sample(RULE_FIELDS, rng.randint(1, len(RULE_FIELDS)))
                first = True
                for f in fields:
                    lead = "  - " if first else "    "
                    first = False
                    if f == "name":
                        value = rng.choice([f"r{i}", "r0", "", "x" * 300, "ünïcode", "[x]"])
                    elif f == "match":
                        value = quoted(rng, expression(rng, TASK_ATTRIBUTES))
                    else:
                        value = rng.choice(SCALARS)
                    lines.append(f"{lead}{f}: {value}")
        elif field == "rebalance":
            lines.append(rng.choice(["rebalance:", "rebalance: true", "rebalance: {}"]))
            if lines[-1] == "rebalance:":
                for f in rng.sample(REBALANCE_FIELDS, rng.randint(0, len(REBALANCE_FIELDS))):
                    value = (
                        quoted(rng, expression(rng, TASK_ATTRIBUTES))
                        if f == "match"
                        else rng.choice(SCALARS)
                    )
                    lines.append(f"  {f}: {value}")
        elif field == "anchors":
            lines += shared_aliases(rng)
        else:
            lines.append(f"{field}: {rng.choice(SCALARS)}")
    return ("\n".join(lines) + rng.choice(["\n", "", "\r\n", "\n\n"])).encode("utf-8")


def shared_aliases(rng: random.Random) -> list[str]:
    """A chain of anchors, each a list of aliases to the one before: shared references
    standing for up to 2**40 values, or recursive ones."""
    depth = rng.randint(1, 40)
    width = rng.randint(2, 4)
    lines = ["anchors:", "  a0: &a0 [1, 2]"]
    for i in range(1, depth):
        aliases = ", ".join([f"*a{i - 1}"] * width)
        lines.append(f"  a{i}: &a{i} [{aliases}]")
    if rng.random() < 0.2:
        lines.append(f"  loop: &loop [*loop, *a{depth - 1}]")
    return lines


def _tame(rng: random.Random) -> bytes:
    lines = ["version: 1"]
    if rng.random() < 0.8:
        lines.append("pools:")
        names = ["gpu", "spot", "big"]
        for name in names if rng.random() < 0.7 else rng.sample(names, rng.randint(1, 3)):
            lines.append(f"  {name}: {quoted(rng, tame_expression(rng, TAME_WORKER))}")
    lines.append("rules:")
    for i in range(rng.randint(0, 6)):
        lines.append(f"  - name: r{i}")
        lines.append(f"    match: {quoted(rng, tame_expression(rng, TAME_TASK))}")
        for f in rng.sample(list(TAME), rng.randint(1, 3)):
            lines.append(f"    {f}: {rng.choice(TAME[f])}")
    if rng.random() < 0.3:
        lines.append("rebalance:")
        lines.append(f"  gap: {rng.choice(['5%', '10%', '0.2'])}")
        lines.append(f"  max-bytes-per-cycle: {rng.choice(['1 GiB', '100 MiB'])}")
    if rng.random() < 0.3:
        lines.append(f"reduce-replicas: {rng.choice(['true', 'false'])}")
    return ("\n".join(lines) + "\n").encode("utf-8")


def mutate(rng: random.Random, data: bytes, rounds: int) -> bytes:
    """Byte- and line-level mutations of ``data``."""
    buf = bytearray(data)
    for _ in range(rounds):
        kind = rng.randrange(9)
        pos = rng.randint(0, len(buf))
        if kind == 0:
            buf[pos:pos] = rng.choice(TOKENS)
        elif kind == 1:
            del buf[pos : pos + rng.randint(1, 20)]
        elif kind == 2:
            buf[pos : pos + 1] = rng.choice(TOKENS)
        elif kind == 3:
            buf[pos:pos] = bytes([rng.randrange(256)])
        else:
            lines = bytes(buf).split(b"\n")
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            if kind == 4:
                del lines[i]
            elif kind == 5:
                lines.insert(i, lines[i])
            elif kind == 6:
                lines[i], lines[j] = lines[j], lines[i]
            elif kind == 7:
                lines[i] = b" " * rng.randint(0, 9) + lines[i].lstrip(b" ")
            else:
                lines[i] = lines[i] * rng.choice([2, 50])
            buf = bytearray(b"\n".join(lines))
    return bytes(buf)


def splice(rng: random.Random, a: bytes, b: bytes) -> bytes:
    la, lb = a.split(b"\n"), b.split(b"\n")
    cut_a, cut_b = rng.randint(0, len(la)), rng.randint(0, len(lb))
    return b"\n".join(la[:cut_a] + lb[cut_b:])


def cases(seed: int, n: int, seeds: list[bytes] | None = None) -> Iterator[tuple[str, bytes]]:
    """``n`` hostile rules files, reproducible from ``seed``."""
    rng = random.Random(seed)
    pool = seeds if seeds is not None else seed_files()
    for i in range(n):
        turn = i % 3
        if turn == 0:
            data = generated(rng)
            if rng.random() < 0.3:
                data = mutate(rng, data, rng.randint(1, 3))
            yield "generated", data
        elif turn == 1:
            yield "mutated", mutate(rng, rng.choice(pool), rng.randint(1, 6))
        else:
            a = rng.choice(pool) if rng.random() < 0.5 else generated(rng)
            yield "spliced", mutate(rng, splice(rng, a, rng.choice(pool)), rng.randint(0, 2))


def _shared(depth: int) -> list[object]:
    value: list[object] = ["gold", "gold"]
    for _ in range(depth - 1):
        value = [value, value]
    return value


#: A list standing for 2**20 values through shared references (a pickled annotation).
SHARED = _shared(20)

#: Facts a fuzzed ruleset's matches and pools are run on: odd keys, huge sizes, NaN and
#: nested values in annotations, missing attributes.
TASKS = [
    TaskFacts(key="x-1", prefix="stage1", nbytes=10, replicas=2, annotations={"tier": "gold"}),
    TaskFacts(key="a" * 5000, prefix="", type="numpy.ndarray", nbytes=2**40),
    TaskFacts(key="", annotations={"tier": float("nan"), "x-y": [1, "a"], "a": None}),
    TaskFacts(key="shared", annotations={"tier": SHARED, "x-y": [SHARED, SHARED], "a": SHARED}),
]
WORKERS = [
    WorkerFacts(address="tcp://10.0.0.1:1", host="10.0.0.1", resources={"GPU": 1}),
    WorkerFacts(address="", memory_limit=2**40, memory=2**39, memory_fraction=0.5, nthreads=64),
]


def check_and_run(data: bytes) -> tuple[Ruleset | None, list[Diagnostic]]:
    """Check one fuzzed file and, if it gives a ruleset, run every match (through the
    cascade) and every pool on :data:`TASKS` and :data:`WORKERS`. Raises whatever
    escapes; a caller counts that as a failure."""
    ruleset, diagnostics = check_text(data, "fuzz.yaml")
    if ruleset is not None:
        for task in TASKS:
            ruleset.resolve(task)
        for pool in ruleset.pools.values():
            for worker in WORKERS:
                pool.predicate(worker)
    return ruleset, diagnostics
