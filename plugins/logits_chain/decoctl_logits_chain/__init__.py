"""decoctl-logits-chain: ordered logits processors for decoctl and the ``chain`` sampling controller.

Install it and every decoctl controller accepts ``--processors "repetition_penalty=1.1,top_k=40,top_p=0.95"``;
``decoctl generate -c chain`` samples from the processed distribution.
"""

from decoctl_logits_chain.biases import SequenceBias, SuppressTokensAtBegin
from decoctl_logits_chain.controller import ChainController, pick_token
from decoctl_logits_chain.dry import Dry
from decoctl_logits_chain.numeric import Normalize, RemoveInvalid
from decoctl_logits_chain.penalties import (
    BadWords,
    ExponentialDecayLengthPenalty,
    FrequencyPenalty,
    LogitBias,
    MinLength,
    MinNewTokens,
    NoRepeatNGram,
    PresencePenalty,
    RepetitionPenalty,
    SuppressTokens,
)
from decoctl_logits_chain.samplers import DynamicTemperature, ExcludeTopChoices, TopH, TopNSigma
from decoctl_logits_chain.terminal import GreedyTerminal, SampleTerminal
from decoctl_logits_chain.warpers import Epsilon, Eta, MinP, Temperature, TopK, TopP, TypicalP

__all__ = [
    "BadWords",
    "ChainController",
    "Dry",
    "DynamicTemperature",
    "Epsilon",
    "Eta",
    "ExcludeTopChoices",
    "ExponentialDecayLengthPenalty",
    "FrequencyPenalty",
    "GreedyTerminal",
    "LogitBias",
    "MinLength",
    "MinNewTokens",
    "MinP",
    "NoRepeatNGram",
    "Normalize",
    "PresencePenalty",
    "RemoveInvalid",
    "RepetitionPenalty",
    "SampleTerminal",
    "SequenceBias",
    "SuppressTokens",
    "SuppressTokensAtBegin",
    "Temperature",
    "TopH",
    "TopK",
    "TopNSigma",
    "TopP",
    "TypicalP",
    "pick_token",
]
