"""The most probable birth dates the embedded model gives George Washington, from Python.

    python examples/birthdays.py      (about 9 s on 2 CPU cores, the model loaded from relmql's cache)

Compiles the query into a token automaton over the model's canonical tokenization, then walks
it best-first: results come out in exact order of P(date | "George Washington was born on").
"""

from relmql.automata import CompileOptions, compile
from relmql.execute import Decoding, ShortestPath, execute
from relmql.models import load_model

MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
PREFIX = "George Washington was born on"

model = load_model("smollm2-135m")
automaton = compile(f"{PREFIX} ({MONTHS}) [0-9]{{1,2}}, [0-9]{{4}}", model.vocabulary, PREFIX,
                    CompileOptions(tokenization="canonical"))
print(f"{automaton.language.num_strings:,} strings; byte automaton of "
      f"{automaton.language.dfa.num_states} states")
for row in execute(automaton, model, ShortestPath(order="prob", limit=5), Decoding(topk=40)):
    print(f"{row.rank}. {row.prob:.4f}  {row.text}")
