from kernels.kda.naive import kda_gate, kda_step, naive_recurrent_kda

__all__ = ["kda_gate", "kda_step", "naive_recurrent_kda"]
