/*
 * test_lsan_onednn.h - for the suites that run the cpu engine's
 * precision=bf16 path (oneDNN) under `make asan`: LeakSanitizer (GCC 12)
 * faults in its tracer reading the dynamic TLS of oneDNN's OpenMP worker
 * threads on glibc 2.36, so TLS is not scanned; glibc keeps a dlerror()
 * message per thread (oneDNN probes optional libraries), which is not ours
 * to free. Include it once, in the suite's main file.
 */
#ifndef ORCH_TEST_LSAN_ONEDNN_H
#define ORCH_TEST_LSAN_ONEDNN_H

#if defined(__SANITIZE_ADDRESS__)
const char *__lsan_default_options(void);
const char *__lsan_default_options(void) { return "use_tls=0"; }
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
    return "leak:_dlerror_run\nleak:_dl_exception_create\n";
}
#endif

#endif
