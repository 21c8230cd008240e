"""A tiny random-weight Qwen3 model that `mlx_lm.load` loads and generates from.

It backs the CLI's built-in `demo` model (built into the cache on first use) and
the test suite (built once per session into a temp dir). The weights are random,
so the text it writes is gibberish; everything around the weights is real:

* config.json - a Qwen3 config (`model_type: qwen3`) plus `"mlxbun_demo": true`;
* model.safetensors - weights of mlx_lm's own qwen3 `Model`, seeded, so the same
  seed gives byte-identical files;
* tokenizer.json / tokenizer_config.json - a byte-level BPE trained here on
  text embedded in this module, with Qwen's special tokens, a Qwen3 chat template
  (tools, `<tool_call>` JSON, `<think>` reasoning, `enable_thinking`), so
  mlx_lm detects thinking and the `json_tools` tool parser;
* generation_config.json - Qwen3's sampling defaults and both end tokens.

Nothing here touches the network or any file outside this module.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "SIZES",
    "SPECIAL_TOKENS",
    "DEMO_MARKER",
    "build_demo_model",
    "is_demo_model",
]

DEMO_MARKER = "mlxbun_demo"

DEMO_NOTE = (
    "mlxbun demo model: RANDOM weights (not trained), built locally by "
    "mlxbun_cli.demo_model for trying mlxbun offline and for tests; its text is gibberish."
)

_COMMON: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "max_position_embeddings": 4096,
    "sliding_window": None,
    "use_sliding_window": False,
    "use_cache": True,
    "tie_word_embeddings": True,
    # float32: the fastest dtype for mlx on CPU, and exact for tests.
    "torch_dtype": "float32",
}

SIZES: dict[str, dict[str, Any]] = {
    # ~0.16M parameters: builds and loads in well under a second.
    "tiny": {
        **_COMMON,
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_window_layers": 2,
        "vocab_size": 1024,
    },
    # ~30M parameters: big enough to feel like a model, small enough for CPU.
    "30m": {
        **_COMMON,
        "hidden_size": 512,
        "intermediate_size": 1792,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "max_window_layers": 8,
        "vocab_size": 4096,
    },
}

# Appended after the learned BPE vocab, in this order (as in Qwen's tokenizer):
# the first three are "special" (skipped by decode(skip_special_tokens=True)),
# the rest are plain added tokens, so they survive decoding like Qwen3's do.
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ADDED_TOKENS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
_ALL_ADDED = SPECIAL_TOKENS + ADDED_TOKENS

# Qwen2/Qwen3's pre-tokenizer split: words, single digits, punctuation runs, spaces.
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The Qwen3 chat template (structure of Qwen/Qwen3-*'s tokenizer_config.json).
# `tool_call.name` and `<tool_call>\n{` make mlx_lm pick the `json_tools` parser.
CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""  # noqa: E501

# A few KB of plain English (and a little code and JSON) to train the BPE on.
_TEXT = """\
The morning was cold and bright, and the river ran fast under the old stone bridge.
People walked to work with their hands in their pockets, talking about the weather,
the news, and the price of bread. A small dog followed a boy along the water, and
the boy threw a stick that the dog would not bring back.

How do you make a good cup of tea? Boil fresh water, warm the pot, and add one spoon
of leaves for each person and one for the pot. Pour the water, wait three or four
minutes, then pour. Some people add milk first; others say that is a terrible idea.

Question: What is the capital of France? Answer: The capital of France is Paris.
Question: How many days are there in a week? Answer: There are seven days in a week.
Question: Why is the sky blue? Answer: Sunlight is scattered by the air, and blue
light is scattered more than red light, so the sky looks blue during the day.

def add(a, b):
    \"\"\"Return the sum of two numbers.\"\"\"
    return a + b

for i in range(10):
    print(f"item {i}: {add(i, 2)}")

import json
data = {"name": "get_weather", "arguments": {"city": "London", "unit": "celsius"}}
print(json.dumps(data, indent=2))

{"name": "search", "arguments": {"query": "best pizza in town", "limit": 5}}
{"name": "get_time", "arguments": {"timezone": "Europe/Berlin"}}
{"result": "ok", "temperature": 21.5, "humidity": 0.4, "items": [1, 2, 3], "done": true}

User: Can you help me plan a trip to the mountains next month?
Assistant: Of course. How many days do you have, and do you prefer hiking, skiing,
or just relaxing in a quiet village with good food and a view of the lake?
User: Four days, and I would like to hike a little and eat a lot.
Assistant: Then stay in a small town near the trails, take one long walk on the
second day, and leave the last day free in case the weather turns bad.

Let me think about this step by step. First, we need to understand the problem.
Then we can break it into smaller parts, solve each part, and check the answer.
If the answer does not make sense, we go back and look for the mistake. Thinking
carefully is slower, but it is usually faster than fixing a wrong result later.

The history of computing is full of surprising turns. Early machines filled whole
rooms and used thousands of tubes; today a phone in your pocket is far more powerful.
Programs are written in languages such as Python, Rust, C, JavaScript and Go, and
they run on processors that perform billions of simple operations every second.
A language model reads text as a sequence of tokens and learns to predict the next
token. Given a prompt, it writes one token at a time, choosing each from a list of
probabilities, which is why the same question can get different answers.

Once upon a time there was a baker who lived at the edge of a forest. Every night
she baked bread for the village, and every morning the bread was gone before the
sun came up. One night she stayed awake and saw a family of foxes carrying loaves
into the trees. She laughed, baked twice as much the next night, and from then on
the foxes left small gifts at her door: a feather, a shiny stone, a red leaf.

Important: Please read the instructions before you begin. Write your name at the top
of the page. Answer all questions, show your work, and keep your answers short and
clear. You have one hour. When you are finished, check your answers and hand in the
paper. Good luck!

Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 25 50 100 365 1024 2024 3.14 42 99%.
Dates: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday; January,
February, March, April, May, June, July, August, September, October, November, December.
Colors: red, orange, yellow, green, blue, purple, black, white, gray, brown, pink.
"""

# More common English words, so the larger vocabularies have enough to learn from.
_WORDS = """\
about above across act action add after again against age ago agree air all allow
almost alone along already also although always among amount and animal another answer
any anyone anything appear apple area arm army around arrive art as ask at attack
away baby back bad bag ball bank bar base basket battle be bear beat beautiful because
become bed before begin behind believe bell belong below best better between big bird
bit black block blood board boat body bone book born both bottle bottom box brain branch
break bridge bright bring brother build burn business busy but buy by call camera camp
can car card care carry case cat catch cause cell center century certain chair chance
change character charge check child choose church circle city class clean clear climb
clock close cloud coast coat cold collect college come common company compare complete
computer condition consider contain continue control cook cool copy corner correct cost
could count country course cover create cross crowd cry culture cup current cut dark data
daughter dead deal death decide deep degree describe design detail develop die difference
difficult dinner direction discover discuss disease do doctor door down draw dream dress
drink drive drop dry during each ear early earth east easy eat edge education effect egg
eight either electric element else end energy engine enjoy enough enter entire equal
error even evening event ever every exactly example except exercise expect experience
explain eye face fact fall family famous far farm fast father fear feel few field fight
figure file fill film final find fine finger finish fire first fish five flat floor flower
fly follow foot force foreign forget form forward four free friend from front fruit full
fun future game garden gas gather general girl give glass go gold good government grass
great ground group grow guess gun hair half hall hand happen happy hard hat have he head
hear heart heat heavy help her here high hill him his hit hold hole home hope horse hospital
hot hotel hour house human hundred hunt idea if image imagine in include increase indeed
industry information inside instead interest into iron island it job join joke journey
judge jump just keep key kill kind king kitchen knee know lady land language large last
late laugh law lay lead learn least leave left leg less letter level library lie life lift
like line list listen little live local long look lose loud love low machine main major
make man manage many map mark market marry matter may maybe mean measure meat meet member
memory message metal method middle might mile mind minute miss modern moment money month
moon more most mother mountain mouse mouth move much music must name nation nature near
neck need never new news next nice night nine noise north nose note nothing notice now
number object ocean off offer office often oil old on only open order other our out over
own page paint pair paper parent park part party pass past path pay peace pen people
perhaps period person picture piece place plan plant play please point police poor popular
position possible power practice prepare present press pretty problem produce program
project protect prove provide public pull push put quick quiet race radio rain raise reach
read ready real reason receive record region remember repeat report rest return rich ride
right ring rise road rock role room root rule run safe salt same save say school science
sea season seat second section see seem sell send sense sentence serve set seven several
shake shape share she ship shoe shop short should shoulder show side sign simple since
sing single sister sit size skin sleep slow small smell smile snow so soft soil soldier
some son song soon sound south space speak special speed spend sport spring square stand
star start state station stay step still stone stop store story street strong student
study subject success sudden sugar summer sun supply support sure surface system table
tail take tall teach team tell ten test than thank that their them then there these thing
third those though thought thousand three through throw time tiny today together tomorrow
tone tool top total touch toward town track trade train travel tree trip trouble true try
turn twelve twenty two type under understand unit until up upon use usual valley value
very village visit voice wait walk wall want war warm wash watch wave way wear week weight
well west what wheel when where whether which while whole why wide wife wild will win wind
window winter wish with within without woman wonder wood word work world worry would write
wrong yard year yes yet you young your zero
"""


def _training_text(rounds: int) -> list[str]:
    """The BPE training corpus; `rounds` > 0 adds made-up words for bigger vocabs."""
    rng = random.Random(1234)
    texts = [_TEXT] * 4
    prose_words = sorted(set("".join(c if c.isalpha() else " " for c in _TEXT).lower().split()))
    words = sorted(set(_WORDS.split()) | set(prose_words))
    for _ in range(2):
        for w in words:
            variants = (w, " " + w, w.capitalize(), " " + w.capitalize(), " " + w + "s")
            texts.append(" ".join(variants))
    for _ in range(400):
        n = rng.randint(6, 16)
        sentence = " ".join(rng.choice(words) for _ in range(n))
        texts.append(sentence.capitalize() + rng.choice([".", "?", "!", ",", ":", ";"]) + "\n")
    if rounds:
        syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]
        for _ in range(rounds * 400):
            made_up = "".join(rng.choice(syllables) for _ in range(rng.randint(2, 4)))
            texts.append(" " + made_up + " " + made_up)
    return texts


def _build_tokenizer(vocab_size: int):
    """A Qwen-style byte-level BPE with exactly `vocab_size` tokens."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    learned = vocab_size - len(_ALL_ADDED)
    for rounds in range(6):
        tok = Tokenizer(models.BPE(byte_fallback=False, fuse_unk=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        trainer = trainers.BpeTrainer(
            vocab_size=learned,
            min_frequency=1,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=[],
        )
        tok.train_from_iterator(_training_text(rounds), trainer=trainer)
        if tok.get_vocab_size() == learned:
            break
    else:  # pragma: no cover - the corpus above is big enough for SIZES
        raise RuntimeError(f"could not train a BPE vocabulary of {vocab_size} tokens")

    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    assert tok.get_vocab_size() == vocab_size
    return tok


def _tokenizer_config(tok, max_length: int) -> dict[str, Any]:
    decoder = {}
    for token in _ALL_ADDED:
        decoder[str(tok.token_to_id(token))] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": token in SPECIAL_TOKENS,
        }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": max_length,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }


def _save_weights(config: dict[str, Any], seed: int, path: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3

    dtype = getattr(mx, config.get("torch_dtype", "float32"))
    args = qwen3.ModelArgs.from_dict(config)
    mx.random.seed(seed)
    model = qwen3.Model(args)
    weights = {k: v.astype(dtype) for k, v in tree_flatten(model.parameters())}
    mx.eval(weights)
    mx.save_safetensors(str(path), weights, metadata={"format": "mlx"})


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def build_demo_model(dest: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write a random-weight Qwen3 model of `size` (a key of SIZES) into `dest`.

    Same size and seed give byte-identical files. Everything is built in a temp
    dir beside `dest` and moved in file by file, model.safetensors last, so a
    present model.safetensors means a complete build (and a concurrent builder
    only ever replaces files with identical ones). Returns `dest`.
    """
    if size not in SIZES:
        raise ValueError(f"unknown demo model size {size!r}; choose from {', '.join(SIZES)}")
    dest = Path(dest).expanduser()
    dest.parent.mkdir(parents=True, exist_ok=True)
    sizes = SIZES[size]

    tok = _build_tokenizer(sizes["vocab_size"])
    ids = {t: tok.token_to_id(t) for t in _ALL_ADDED}
    eos, eot = ids["<|im_end|>"], ids["<|endoftext|>"]
    config = {
        **sizes,
        "bos_token_id": eot,
        "eos_token_id": eos,
        DEMO_MARKER: True,
        "mlxbun_demo_size": size,
        "mlxbun_demo_seed": seed,
        "mlxbun_note": DEMO_NOTE,
    }
    generation_config = {
        "do_sample": True,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "bos_token_id": eot,
        "pad_token_id": eot,
        "eos_token_id": [eos, eot],
    }

    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.build-", dir=dest.parent))
    try:
        tok.save(str(tmp / "tokenizer.json"))
        _write_json(
            tmp / "tokenizer_config.json",
            _tokenizer_config(tok, sizes["max_position_embeddings"]),
        )
        _write_json(tmp / "generation_config.json", generation_config)
        _write_json(tmp / "config.json", config)
        _save_weights(config, seed, tmp / "model.safetensors")
        dest.mkdir(exist_ok=True)
        for name in (
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
            "config.json",
            "model.safetensors",
        ):
            os.replace(tmp / name, dest / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def is_demo_model(path: Path) -> bool:
    """Whether `path` (a model dir, or its config.json) was built by build_demo_model."""
    path = Path(path).expanduser()
    config_path = path if path.name == "config.json" else path / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(config, dict) and config.get(DEMO_MARKER) is True
