/* A stand-in for libcuda (test-only): "device" memory is host memory and cuLaunchKernel hands the
 * kernel name and its argument array to a callback, which runs the kernel on the simulated GPU.
 * It checks what a real driver would reject: missing entries, bad grids, unknown kernel names. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*launch_cb)(const char *, unsigned, unsigned, void **);
static launch_cb CB;
static int LAUNCHES, LIVE;
static long HTOD_BYTES;

void fake_set_callback(launch_cb cb) { CB = cb; }
int fake_launches(void) { return LAUNCHES; }
int fake_live_allocations(void) { return LIVE; }
long fake_htod_bytes(void) { return HTOD_BYTES; }

int cuInit(unsigned flags) { return flags ? 1 : 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int i) { if (i != 0) return 101; *d = 0; return 0; }
int cuDeviceGetName(char *buf, int len, int d) { snprintf(buf, len, "Fake GPU %d", d); return 0; }
int cuDeviceGetAttribute(int *v, int attr, int d) { *v = attr == 75 ? 8 : 7; return 0; }
int cuDevicePrimaryCtxRetain(void **ctx, int d) { *ctx = (void *)0x1; return 0; }
int cuDevicePrimaryCtxRelease_v2(int d) { return 0; }
int cuCtxSetCurrent(void *ctx) { return ctx ? 0 : 201; }
int cuCtxSynchronize(void) { return 0; }
int cuModuleLoadDataEx(void **m, const char *ptx, unsigned n, int *opts, void **vals) {
    if (!strstr(ptx, ".entry") || !strstr(ptx, ".target sm_")) {
        if (n >= 2 && opts[0] == 5) snprintf((char *)vals[0], (size_t)vals[1], "ptxas fatal: no kernel");
        return 218;
    }
    *m = strdup(ptx);
    return 0;
}
int cuModuleGetFunction(void **f, void *m, const char *name) {
    char pat[512];
    snprintf(pat, sizeof pat, ".entry %s(", name);
    if (!strstr((const char *)m, pat)) return 500;
    *f = strdup(name);
    return 0;
}
int cuModuleUnload(void *m) { free(m); return 0; }
int cuMemAlloc_v2(uint64_t *p, size_t n) {
    *p = (uint64_t)(uintptr_t)aligned_alloc(256, (n + 255) / 256 * 256);
    LIVE++;
    return *p ? 0 : 2;
}
int cuMemFree_v2(uint64_t p) { free((void *)(uintptr_t)p); LIVE--; return 0; }
int cuMemsetD8_v2(uint64_t p, unsigned char v, size_t n) { memset((void *)(uintptr_t)p, v, n); return 0; }
int cuMemcpyHtoD_v2(uint64_t d, const void *s, size_t n) { memcpy((void *)(uintptr_t)d, s, n); HTOD_BYTES += n; return 0; }
int cuMemcpyDtoH_v2(void *d, uint64_t s, size_t n) { memcpy(d, (void *)(uintptr_t)s, n); return 0; }
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra) {
    if (!gx || gx > 2147483647u || gy != 1 || gz != 1 || !bx || bx > 1024 || by != 1 || bz != 1 || extra) return 1;
    LAUNCHES++;
    if (CB) CB((const char *)f, gx, bx, params);
    return 0;
}
int cuGetErrorString(int rc, const char **s) { *s = rc == 218 ? "a PTX JIT compilation failed" : "fake error"; return 0; }
