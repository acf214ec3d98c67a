# SPDX-License-Identifier: MIT
#
# toolcall_data.py -- the synthetic tool-call conversations of glm-pydoc-tools, from fixed-seed
# generators.  Four tools (get_weather, get_time, add, lookup); each conversation offers the
# tool it needs and one or two others, in a shuffled order: [system?], user, assistant tool call,
# tool result, assistant answer that uses the result.  The values (cities, numbers, glossary
# terms, results) are split into a training pool and a held-out pool: held-out conversations
# (evaluate_tools.py, tests/serve/toolmodel_test.mjs) use only values no training conversation
# contains.  Conversations are in the form text/chat.c renders (OpenAI messages, tool-call
# arguments as objects, as the server passes them on).

import random

TOOLS = {
    "get_weather": {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    "get_time": {"type": "function", "function": {
        "name": "get_time", "description": "Get the local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}},
    "add": {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                        "b": {"type": "integer"}},
                       "required": ["a", "b"]}}},
    "lookup": {"type": "function", "function": {
        "name": "lookup", "description": "Look up a term in the Python glossary",
        "parameters": {"type": "object", "properties": {"term": {"type": "string"}},
                       "required": ["term"]}}},
}

CITIES = """Paris London Berlin Madrid Rome Lisbon Vienna Prague Warsaw Budapest Athens Dublin
Oslo Stockholm Helsinki Copenhagen Amsterdam Brussels Zurich Geneva Munich Hamburg Milan Naples
Barcelona Seville Lyon Marseille Krakow Riga Vilnius Sofia Bucharest Belgrade Zagreb Istanbul
Ankara Cairo Lagos Accra Dakar Tunis Casablanca Johannesburg Cape Town Addis Ababa Kampala
Mumbai Delhi Chennai Kolkata Karachi Lahore Dhaka Colombo Bangkok Singapore Jakarta Manila Seoul
Busan Tokyo Osaka Beijing Shanghai Shenzhen Taipei Hong Kong Sydney Melbourne Perth Brisbane
Auckland Wellington Toronto Montreal Vancouver Chicago Boston Seattle Denver Austin Houston Miami
Atlanta Dallas Phoenix Portland New York Los Angeles San Francisco Mexico City Lima Bogota
Santiago Buenos Aires Havana Caracas Dubai Doha Riyadh Tehran Baghdad Beirut Amman Tashkent
Almaty Baku Yerevan Minsk Kyiv Odesa Edinburgh Glasgow Cardiff Belfast Bristol Leeds""".split()
# (multi-word cities are joined below)
_JOIN = {"Cape": "Cape Town", "Addis": "Addis Ababa", "Hong": "Hong Kong", "New": "New York",
         "Los": "Los Angeles", "San": "San Francisco", "Mexico": "Mexico City",
         "Buenos": "Buenos Aires"}


def _cities(words):
    out, skip = [], False
    for i, w in enumerate(words):
        if skip:
            skip = False
            continue
        if w in _JOIN:
            out.append(_JOIN[w])
            skip = True
        else:
            out.append(w)
    return out


TRAIN_CITIES = _cities(CITIES)
HELD_CITIES = ["Reykjavik", "Nairobi", "Montevideo", "Tbilisi", "Hanoi", "Quito", "Tallinn",
               "Windhoek", "Kathmandu", "Valletta", "Bergen", "Porto", "Kyoto", "Adelaide",
               "Ljubljana", "Marrakesh"]

SKIES = ["sunny", "cloudy", "light rain", "heavy rain", "snow", "fog", "clear skies", "windy",
         "thunderstorms", "drizzle", "overcast", "partly cloudy", "humid", "mild and dry"]
HELD_SKIES = ["scattered showers", "freezing fog", "sleet", "hazy sunshine"]

TERMS = """iterator generator decorator coroutine closure lambda module package namespace
dictionary tuple list set frozenset bytecode interpreter slice sequence mapping attribute method
function argument parameter keyword annotation docstring exception traceback import metaclass
descriptor property object class instance inheritance mixin abstract base class hashable
immutable mutable iterable awaitable context manager comprehension expression statement
garbage collection reference count virtual environment path entry finder loader""".split()
_TJOIN = {"abstract": "abstract base class", "context": "context manager",
          "garbage": "garbage collection", "reference": "reference count",
          "virtual": "virtual environment", "path": "path entry"}


def _terms(words):
    out, skip = [], 0
    for w in words:
        if skip:
            skip -= 1
            continue
        if w in _TJOIN:
            out.append(_TJOIN[w])
            skip = len(_TJOIN[w].split()) - 1
        else:
            out.append(w)
    return out


TRAIN_TERMS = _terms(TERMS)
HELD_TERMS = ["walrus operator", "f-string", "dunder", "monkey patching", "duck typing",
              "global interpreter lock", "type hint", "wheel"]

DEFS = ["an object that returns its items one at a time",
        "a function that returns a new function",
        "a value that cannot be changed after it is created",
        "a name bound to an object in a scope",
        "a file of Python code that can be imported",
        "a collection of modules in a directory",
        "a mapping from keys to values",
        "an ordered sequence that cannot be changed",
        "a function defined inside a class",
        "the code that runs a Python program",
        "an error raised while a program runs",
        "a class whose instances are classes",
        "an object that defines how an attribute is read",
        "a short way to build a list from an iterable",
        "a text that documents a function or a module",
        "a function that can pause and resume later",
        "the memory of unused objects given back",
        "a directory with its own installed packages",
        "an object with a hash that never changes",
        "an object that can be used in a with statement",
        "the value passed to a function when it is called",
        "a small anonymous function of one expression",
        "a part of a sequence taken by start and stop",
        "the name of a value given in a call"]
HELD_DEFS = ["a prebuilt archive that pip installs directly",
             "an operator that assigns inside an expression",
             "a string literal with expressions in braces",
             "a lock that lets one thread run Python at a time"]

ASK = {
    "get_weather": ["What is the weather in {city}?", "How is the weather in {city} today?",
                    "Tell me the weather in {city}.", "Is it raining in {city}?",
                    "What's the weather like in {city}?", "weather in {city}?",
                    "Can you check the weather for {city}?"],
    "get_time": ["What time is it in {city}?", "What is the local time in {city}?",
                 "Tell me the time in {city}.", "time in {city}?",
                 "Can you check what time it is in {city}?"],
    "add": ["What is {a} plus {b}?", "Add {a} and {b}.", "What is {a} + {b}?",
            "Please add {a} to {b}.", "What do {a} and {b} add up to?",
            "Compute the sum of {a} and {b}."],
    "lookup": ["What does {term} mean?", "Look up {term}.", "What is a {term} in Python?",
               "Define {term}.", "Can you look up the term {term}?",
               "Explain {term} using the glossary."],
}
ANSWER = {
    "get_weather": ["The weather in {city} is {r}.", "In {city} it is {r} right now.",
                    "It is {r} in {city} today."],
    "get_time": ["It is {r} in {city}.", "The local time in {city} is {r}."],
    "add": ["{a} plus {b} is {r}.", "The sum of {a} and {b} is {r}.", "{a} + {b} = {r}."],
    "lookup": ["In Python, {term} means {r}.", "The glossary says: {term} is {r}.",
               "{term}: {r}."],
}
SYSTEMS = ["You are a helpful assistant.", "Answer briefly.", "Use the tools when they help.",
           "You are a helpful assistant. Use the tools when they help."]

HELD_NUMBERS = sorted(random.Random(99).sample(range(10, 1000), 80))
_HELD_NUM_SET = set(HELD_NUMBERS)
TRAIN_NUMBERS = [n for n in range(2, 1000) if n not in _HELD_NUM_SET]


# Made-up values ("synthetic" conversations): names and phrases no pool holds, so that the only
# way to write them is to copy them from the conversation.
_ONSETS = ["b", "br", "d", "f", "g", "k", "kr", "l", "m", "n", "p", "r", "s", "st", "t", "tr",
           "v", "z", "h", "j"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ou"]
_WORDS = """small large quiet bright value list name file line table record buffer thread token
stream number letter object index method class module signal key path reads writes holds keeps
returns stores finds counts joins splits""".split()


def made_up_name(g):
    return "".join(g.choice(_ONSETS) + g.choice(_VOWELS)
                   for _ in range(g.randint(2, 3))).capitalize() + g.choice(["", "n", "k", "r"])


def made_up_word(g):
    """A made-up word (3 in 5), a common one, or a word of a training term: a value made of
    them can be written only by copying it, and knowing the pools' terms does not help."""
    u = g.random()
    if u < 0.6:
        return made_up_name(g).lower()
    return g.choice(_WORDS) if u < 0.8 else g.choice(g.choice(TRAIN_TERMS).split())


def made_up_term(g):
    """A glossary term of one to three words (the held-out terms are phrases like "walrus
    operator")."""
    return " ".join(made_up_word(g) for _ in range(g.choice([1, 1, 2, 2, 3])))


def made_up_phrase(g):
    return "a " + " ".join(made_up_word(g) for _ in range(g.randint(3, 6)))


def tool_result(name, args, g, held, synth=False):
    """What the tool returns (a string) for the arguments."""
    if name == "get_weather":
        sky = made_up_phrase(g)[2:] if synth else g.choice(HELD_SKIES if held else SKIES)
        return "%s, %d degrees" % (sky, g.randint(-15, 40))
    if name == "get_time":
        return "%02d:%02d" % (g.randint(0, 23), g.randint(0, 59))
    if name == "add":
        return str(args["a"] + args["b"])
    return made_up_phrase(g) if synth else g.choice(HELD_DEFS if held else DEFS)


def offer(g, name=None):
    """The tools a conversation offers: the one it needs (or any) and one or two others,
    shuffled; and a system message or None."""
    name = name or g.choice(sorted(TOOLS))
    others = [t for t in sorted(TOOLS) if t != name]
    g.shuffle(others)
    offered = [name] + others[:g.randint(2, 3) - 1]
    g.shuffle(offered)
    return offered, (g.choice(SYSTEMS) if g.random() < 0.3 else None)


def conversation(g, held, name=None, offered=None, system=None, synth=False):
    """One conversation: {"messages", "tools", "call": {name, arguments}, "result"}; synth:
    made-up cities, terms and results instead of the pools' (numbers are random anyway)."""
    if offered is None:
        offered, system = offer(g, name)
    name = name or g.choice(offered)
    if name in ("get_weather", "get_time"):
        args = {"city": made_up_name(g) if synth else
                g.choice(HELD_CITIES if held else TRAIN_CITIES)}
        fill = dict(args)
    elif name == "add":
        pool = HELD_NUMBERS if held else TRAIN_NUMBERS
        args = {"a": g.choice(pool), "b": g.choice(pool)}
        fill = dict(args)
    else:
        args = {"term": made_up_term(g) if synth else
                g.choice(HELD_TERMS if held else TRAIN_TERMS)}
        fill = dict(args)
    msgs = []
    if system:
        msgs.append({"role": "system", "content": system})
    msgs.append({"role": "user", "content": g.choice(ASK[name]).format(**fill)})
    cid = "call_%d" % g.randint(0, 10 ** 6)
    msgs.append({"role": "assistant", "content": None,
                 "tool_calls": [{"id": cid, "type": "function",
                                 "function": {"name": name, "arguments": args}}]})
    r = tool_result(name, args, g, held, synth)
    msgs.append({"role": "tool", "tool_call_id": cid, "content": r})
    msgs.append({"role": "assistant", "content": g.choice(ANSWER[name]).format(r=r, **fill)})
    return {"messages": msgs, "tools": [TOOLS[t] for t in offered],
            "call": {"name": name, "arguments": args}, "result": r}


def training_groups(n_groups, size, seed, synth=False):
    """n_groups groups of size conversations; the conversations of a group offer the same tools
    in the same order and have the same system message (so their prompts share a prefix, which
    finetune_tools.py computes once per group), each with a tool of its own.  synth: seven
    conversations in eight with made-up values."""
    g = random.Random(seed)
    out = []
    for _ in range(n_groups):
        offered, system = offer(g)
        grp = []
        for k in range(size):
            c = conversation(g, False, g.choice(offered), offered, system, synth and k % 8 != 7)
            grp.append({"messages": c["messages"], "tools": c["tools"]})
        out.append(grp)
    return out


def heldout_set(n, seed=2024):
    g = random.Random(seed)
    names = sorted(TOOLS)
    return [conversation(g, True, names[i % len(names)]) for i in range(n)]
