"""Post-training besides RL, each in one module: supervised fine-tuning, learned reward models
and DPO, with the chosen/rejected pairs the last two learn from."""
