"""The applications on the library: what ``ppojax rlhf | sft | rm | dpo`` train and how a run
folder holds it. The library never imports them."""
