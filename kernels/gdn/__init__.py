from kernels.gdn.naive import gdn_gate, gdn_step, naive_recurrent_gdn

__all__ = ["gdn_gate", "gdn_step", "naive_recurrent_gdn"]
