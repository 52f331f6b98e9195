"""Model weights of a checkpoint saved under other names than the model's own.

``save_pretrained`` writes a model's weights under the names of its checkpoint format, reverting transformers'
conversion mapping: a vision-language model's language-model weights, e.g. Qwen2-VL's ``model.language_model.*``,
are written as ``model.*``. ``transformers.Trainer`` resumes by loading that file name for name, so the renamed weights
keep the values they had, with only a logged warning: the resumed run would train on its starting weights.
``from_pretrained`` applies the mapping; :func:`load_renamed_weights` loads a checkpoint that way where the names
differ.
"""

import json
import os

from accelerate.utils import is_peft_model
from safetensors import safe_open
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME


def saved_weight_names(folder: str) -> set[str] | None:
    """The weight names of a checkpoint's safetensors file (or sharded index); None without one."""
    index = os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.isfile(index):
        with open(index) as file:
            return set(json.load(file)["weight_map"])
    single = os.path.join(folder, SAFE_WEIGHTS_NAME)
    if os.path.isfile(single):
        with safe_open(single, framework="pt") as weights:
            return set(weights.keys())
    return None


def load_renamed_weights(model, folder: str) -> None:
    """Load ``folder``'s weights into ``model`` through ``from_pretrained`` when they are saved under names the model
    does not have (a PEFT adapter is left alone: it is saved and loaded by its own names)."""
    if is_peft_model(model):
        return
    names = saved_weight_names(folder)
    if names is None or names <= set(model.state_dict()):
        return
    restored = type(model).from_pretrained(folder, device_map="cpu")
    model.load_state_dict(restored.state_dict())
