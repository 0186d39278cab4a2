"""How ppojax's programs are compiled and laid out: compile cache, XLA/CPU settings, devices."""
