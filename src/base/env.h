/* The engine's switches read from the environment (the backends' A/B
 * switches: PETREL_CUDA_*, the CPU levers' PETREL_CPU_* defaults). Callers
 * read a variable once and keep the answer (a few read it per call). A value
 * these do not accept is named in a warning (pt_log, once per variable and
 * process) and the default is taken, so a typo never silently turns a switch
 * the other way. */
#ifndef PT_BASE_ENV_H
#define PT_BASE_ENV_H

#ifdef __cplusplus
extern "C" {
#endif

/* An on/off switch: unset or empty → dflt; 1, on, true, yes → 1; 0, off,
 * false, no → 0 (any letter case); anything else → dflt and a warning. */
int pt_env_flag(const char *name, int dflt);

/* A whole number in [lo, hi]: unset or empty → dflt; a decimal integer in
 * range (surrounding blanks allowed) → its value; anything else → dflt and a
 * warning naming the range. */
int pt_env_int(const char *name, int lo, int hi, int dflt);

/* One of n whole numbers: unset or empty → dflt; one of allowed[0..n) → its
 * value; anything else → dflt and a warning listing them and naming dflt
 * (or, where dflt is none of them — a caller's "its own rule" — saying the
 * built-in choice is kept). */
int pt_env_pick(const char *name, const int *allowed, int n, int dflt);

#ifdef __cplusplus
}
#endif

#endif
