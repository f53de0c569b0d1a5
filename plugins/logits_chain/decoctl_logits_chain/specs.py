"""The records this plugin contributes: one ProcessorSpec per processor, the ``chain`` ControllerSpec.

The first option of each processor is the one ``name=value`` sets in a chain string
(``"repetition_penalty=1.1,top_k=40,top_p=0.95,temperature=0.8"``). Every bad value raises ConfigError when the
chain is parsed, before any model is loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from decoctl import ConfigError, ControllerSpec, Option, ProcessorSpec
from decoctl_logits_chain import biases, dry, numeric, penalties, samplers, terminal, warpers
from decoctl_logits_chain._parse import parse_bias, parse_sequence_bias, parse_sequences, parse_texts, parse_tokens
from decoctl_logits_chain.controller import ChainController

__all__ = ["controller_specs", "processor_specs"]

KEEP = Option(
    name="min_tokens_to_keep", type="int", default=1, minimum=1, help="never drop the this-many most probable tokens"
)


def _open_unit(name: str, default: float, what: str) -> Option:
    """An option strictly between 0 and 1."""
    return Option(
        name=name,
        type="float",
        default=default,
        minimum=0.0,
        maximum=1.0,
        exclusive_minimum=True,
        exclusive_maximum=True,
        help=f"{what}, between 0 and 1 exclusive",
    )


def _required(name: str, option: str, value: Any, example: str) -> Any:
    if value is None or value == "":
        raise ConfigError(f"logits processor {name!r} needs {option}, e.g. {example}")
    return value


def _parsed(options: dict[str, Any], name: str, option: str, parse: Callable[[str, str], Any], example: str) -> Any:
    """The processor's required ``option``, parsed; a missing one raises with ``example`` (a value of it)."""
    return parse(_required(name, option, options[option], f"{name}='{example}'"), name)


def _grammar(options: dict[str, Any]) -> Any:
    from decoctl_logits_chain.grammar import KINDS, Grammar  # llguidance is an optional extra

    given = [(kind, options[kind]) for kind in KINDS if options.get(kind)]
    if len(given) != 1:
        raise ConfigError(
            f"logits processor 'grammar' needs exactly one of {', '.join(KINDS)} (got "
            f"{[kind for kind, _ in given] or 'none'}), e.g. grammar='[0-9]+' for a regex"
        )
    return Grammar(*given[0])


def _spec(name: str, summary: str, factory: Callable[[dict[str, Any]], Any], *options: Option) -> ProcessorSpec:
    return ProcessorSpec(name=name, summary=summary, factory=factory, options=options)


def processor_specs() -> tuple[ProcessorSpec, ...]:
    include_prompt = Option(
        name="include_prompt", type="bool", default=True, help="count the prompt's tokens too (transformers does)"
    )
    generated_only = Option(
        name="include_prompt", type="bool", default=False, help="count the prompt's tokens too (OpenAI does not)"
    )
    return (
        _spec(
            "temperature",
            "logits / T",
            lambda o: warpers.Temperature(o["temperature"]),
            Option(
                name="temperature",
                type="float",
                default=1.0,
                minimum=0.0,
                exclusive_minimum=True,
                help="> 0; below 1 sharpens",
            ),
        ),
        _spec(
            "top_k",
            "keep the k most probable tokens",
            lambda o: warpers.TopK(o["top_k"], o["min_tokens_to_keep"]),
            Option(name="top_k", type="int", default=50, minimum=1, help="tokens to keep"),
            KEEP,
        ),
        _spec(
            "top_p",
            "nucleus: keep the most probable tokens whose mass reaches top_p",
            lambda o: warpers.TopP(o["top_p"], o["min_tokens_to_keep"]),
            Option(name="top_p", type="float", default=0.9, minimum=0.0, maximum=1.0, help="probability mass"),
            KEEP,
        ),
        _spec(
            "min_p",
            "drop tokens less probable than min_p times the most probable",
            lambda o: warpers.MinP(o["min_p"], o["min_tokens_to_keep"]),
            Option(name="min_p", type="float", default=0.05, minimum=0.0, maximum=1.0, help="fraction of the top p"),
            KEEP,
        ),
        _spec(
            "typical_p",
            "locally typical sampling",
            lambda o: warpers.TypicalP(o["typical_p"], o["min_tokens_to_keep"]),
            _open_unit("typical_p", 0.9, "probability mass"),
            KEEP,
        ),
        _spec(
            "epsilon",
            "drop tokens with probability below epsilon",
            lambda o: warpers.Epsilon(o["epsilon"], o["min_tokens_to_keep"]),
            _open_unit("epsilon", 3e-4, "the probability below which a token is dropped"),
            KEEP,
        ),
        _spec(
            "eta",
            "drop tokens below an entropy-dependent cutoff min(eta, sqrt(eta) * exp(-H))",
            lambda o: warpers.Eta(o["eta"], o["min_tokens_to_keep"]),
            _open_unit("eta", 2e-3, "the cutoff's scale"),
            KEEP,
        ),
        _spec(
            "repetition_penalty",
            "divide positive / multiply negative logits of tokens already seen",
            lambda o: penalties.RepetitionPenalty(o["penalty"], o["include_prompt"]),
            Option(
                name="penalty",
                type="float",
                default=1.1,
                minimum=0.0,
                exclusive_minimum=True,
                help="> 0; above 1 discourages repetition (1 is no penalty)",
            ),
            include_prompt,
        ),
        _spec(
            "presence_penalty",
            "subtract a constant from every token already generated",
            lambda o: penalties.PresencePenalty(o["penalty"], o["include_prompt"]),
            Option(name="penalty", type="float", default=0.5, help="subtracted once per distinct token"),
            generated_only,
        ),
        _spec(
            "frequency_penalty",
            "subtract penalty times each token's count so far",
            lambda o: penalties.FrequencyPenalty(o["penalty"], o["include_prompt"]),
            Option(name="penalty", type="float", default=0.5, help="subtracted per occurrence"),
            generated_only,
        ),
        _spec(
            "no_repeat_ngram",
            "never repeat an n-gram of the prefix",
            lambda o: penalties.NoRepeatNGram(o["ngram_size"]),
            Option(name="ngram_size", type="int", default=3, minimum=1, help="n"),
        ),
        _spec(
            "min_length",
            "no EOS before the sequence (prompt included) has min_length tokens",
            lambda o: penalties.MinLength(o["min_length"]),
            Option(name="min_length", type="int", default=0, minimum=0, help="tokens, prompt included"),
        ),
        _spec(
            "min_new_tokens",
            "no EOS before min_new_tokens tokens were generated",
            lambda o: penalties.MinNewTokens(o["min_new_tokens"]),
            Option(name="min_new_tokens", type="int", default=0, minimum=0, help="generated tokens"),
        ),
        _spec(
            "logit_bias",
            "add a fixed bias to given tokens",
            lambda o: penalties.LogitBias(_parsed(o, "logit_bias", "biases", parse_bias, "13:-5 42:2.5")),
            Option(name="biases", type="str", help="TOKEN:BIAS pairs separated by spaces, or a JSON object"),
        ),
        _spec(
            "bad_words",
            "never complete a banned token sequence",
            lambda o: penalties.BadWords(_parsed(o, "bad_words", "sequences", parse_sequences, "5 6 7 | 9")),
            Option(name="sequences", type="str", help="token sequences separated by '|', or a JSON list of lists"),
        ),
        _spec(
            "suppress_tokens",
            "never produce the given tokens",
            lambda o: penalties.SuppressTokens(_parsed(o, "suppress_tokens", "tokens", parse_tokens, "13 42")),
            Option(name="tokens", type="str", help="token ids separated by spaces, or a JSON list"),
        ),
        _spec(
            "exponential_decay_length_penalty",
            "after start generated tokens, raise EOS's logit by |logit| * (factor^k - 1)",
            lambda o: penalties.ExponentialDecayLengthPenalty(o["start"], o["factor"]),
            Option(name="start", type="int", default=64, minimum=0, help="generated tokens before EOS is boosted"),
            Option(name="factor", type="float", default=1.05, minimum=0.0, help="growth per token past start"),
        ),
        _spec(
            "grammar",
            "mask tokens a regex, JSON schema or Lark grammar does not allow (llguidance)",
            _grammar,
            Option(name="regex", type="str", default="", help="a regular expression the output must match"),
            Option(name="json_schema", type="str", default="", help="a JSON schema (JSON text) the output must match"),
            Option(name="lark", type="str", default="", help="a Lark grammar the output must match"),
        ),
        _spec(
            "top_h",
            "top-H: keep the most probable tokens while their entropy stays within top_h of the whole (of the top 100)",
            lambda o: samplers.TopH(o["top_h"]),
            Option(
                name="top_h",
                type="float",
                default=0.4,
                minimum=0.0,
                maximum=1.0,
                exclusive_minimum=True,
                help="> 0 and <= 1: the fraction of the entropy kept",
            ),
        ),
        _spec(
            "top_n_sigma",
            "keep logits within n standard deviations of the largest (top-n-sigma, llama.cpp)",
            lambda o: samplers.TopNSigma(o["n"]),
            Option(name="n", type="float", default=1.0, minimum=0.0, help="standard deviations below the maximum"),
        ),
        _spec(
            "dynamic_temperature",
            "temperature scaled by the row's entropy within temperature +- delta (llama.cpp's dynatemp)",
            lambda o: samplers.DynamicTemperature(o["temperature"], o["delta"], o["exponent"]),
            Option(
                name="temperature",
                type="float",
                default=1.0,
                minimum=0.0,
                exclusive_minimum=True,
                help="the middle temperature, > 0",
            ),
            Option(name="delta", type="float", default=0.5, minimum=0.0, help="range either side, below temperature"),
            Option(
                name="exponent",
                type="float",
                default=1.0,
                minimum=0.0,
                exclusive_minimum=True,
                help="> 0: how the normalised entropy is curved",
            ),
        ),
        _spec(
            "xtc",
            "exclude top choices: sometimes drop every token above a threshold but the least likely (llama.cpp)",
            lambda o: samplers.ExcludeTopChoices(o["probability"], o["threshold"], o["min_tokens_to_keep"]),
            Option(name="probability", type="float", default=0.5, help="how often XTC acts, 0 to 1"),
            Option(
                name="threshold",
                type="float",
                default=0.1,
                minimum=0.0,
                maximum=0.5,
                exclusive_minimum=True,
                help="> 0 and <= 0.5: what counts as a top choice",
            ),
            KEEP,
        ),
        _spec(
            "dry",
            "penalise tokens that would extend a repetition, by base^(length - allowed_length) (DRY, llama.cpp)",
            lambda o: dry.Dry(
                o["multiplier"],
                o["base"],
                o["allowed_length"],
                o["window"],
                parse_texts(o["breakers"], "dry") if o["breakers"] else (),
                parse_tokens(o["breaker_ids"], "dry") if o["breaker_ids"] else (),
            ),
            Option(name="multiplier", type="float", default=0.8, minimum=0.0, help="the penalty's scale; 0 is off"),
            Option(name="base", type="float", default=1.75, help="> 1: growth per token beyond allowed_length"),
            Option(name="allowed_length", type="int", default=2, minimum=1, help="repetitions this long go free"),
            Option(name="window", type="int", default=0, minimum=0, help="search the last this-many tokens; 0: all"),
            Option(
                name="breakers",
                type="str",
                default='\\n|:|"|*',
                help="texts that end a repetition, '|'-separated (every token containing one breaks it)",
            ),
            Option(name="breaker_ids", type="str", default="", help="token ids that end a repetition"),
        ),
        _spec(
            "sequence_bias",
            "add a bias to the last token of a sequence where the prefix ends with the rest of it",
            lambda o: biases.SequenceBias(_parsed(o, "sequence_bias", "biases", parse_sequence_bias, "5 6:-2 | 9:1.5")),
            Option(name="biases", type="str", help="TOKENS:BIAS items separated by '|', or transformers' JSON form"),
        ),
        _spec(
            "suppress_tokens_at_begin",
            "never produce the given tokens as the first generated token",
            lambda o: biases.SuppressTokensAtBegin(
                _parsed(o, "suppress_tokens_at_begin", "tokens", parse_tokens, "13 42"), o["at"]
            ),
            Option(name="tokens", type="str", help="token ids separated by spaces, or a JSON list"),
            Option(name="at", type="int", default=0, minimum=0, help="the generated position they are suppressed at"),
        ),
        _spec("normalize", "replace logits by log-probabilities (log-softmax)", lambda o: numeric.Normalize()),
        _spec(
            "remove_invalid",
            "NaN to 0 and infinities to the largest finite float32 values",
            lambda o: numeric.RemoveInvalid(),
        ),
        _spec("greedy", "terminal: keep only the argmax (decode greedily)", lambda o: terminal.GreedyTerminal()),
        _spec("sample", "terminal: draw from the processed distribution", lambda o: terminal.SampleTerminal()),
    )


def controller_specs() -> tuple[ControllerSpec, ...]:
    return (
        ControllerSpec(
            name="chain",
            summary="sample from the processor chain's distribution (argmax after a greedy terminal)",
            factory=ChainController,
        ),
    )
