/* An LD_PRELOAD interposer for benchmarks/side_by_side.py --dav1d-time: the thread CPU time
 * spent inside dav1d_send_data / dav1d_get_picture, the calls made and the pictures returned,
 * kept apart for the two readers by the caller's library (KohakuClip 1.0.0 reaches libdav1d
 * through the libavcodec of its wheel's kohakuclip.libs; anything else is ours: numba code, or
 * PyAV's own libavcodec on its fallback path).
 * Each call goes on to the libdav1d the process would have used without this file. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <string.h>
#include <time.h>

static long calls[2], pictures[2], nanoseconds[2]; /* added atomically: decode threads race */

static long thread_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static int reader_of(void *return_address) {
    Dl_info info;
    return dladdr(return_address, &info) && info.dli_fname &&
           strstr(info.dli_fname, "kohakuclip.libs") && strstr(info.dli_fname, "libavcodec");
}

struct wanted {
    const char *folder; /* a part of the library's path, or NULL for any */
    const char *found;
};

static int find_dav1d(struct dl_phdr_info *info, size_t size, void *data) {
    struct wanted *wanted = data;
    (void)size;
    if (info->dlpi_name && strstr(info->dlpi_name, "libdav1d") &&
        (!wanted->folder || strstr(info->dlpi_name, wanted->folder))) {
        wanted->found = info->dlpi_name;
        return 1;
    }
    return 0;
}

/* What the caller would have reached: the next definition in the global scope (where a
 * libdav1d loaded globally, as ours is, comes first for every library), else the caller's own
 * libdav1d (1.0.0's, in kohakuclip.libs). Resolved once per reader, at its first call, when
 * its other dav1d functions are bound too. */
static void *real(const char *name, int reader) {
    void *next = dlsym(RTLD_NEXT, name);
    struct wanted wanted = {reader ? "kohakuclip.libs" : NULL, NULL};
    if (next) return next;
    dl_iterate_phdr(find_dav1d, &wanted);
    void *handle = wanted.found ? dlopen(wanted.found, RTLD_LAZY | RTLD_NOLOAD) : NULL;
    return handle ? dlsym(handle, name) : NULL;
}

typedef int (*Call)(void *, void *);

static int timed(Call call, void *context, void *argument, int reader, int picture) {
    long start = thread_ns();
    int status = call(context, argument);
    __atomic_fetch_add(&nanoseconds[reader], thread_ns() - start, __ATOMIC_RELAXED);
    if (status == 0) __atomic_fetch_add(picture ? &pictures[reader] : &calls[reader], 1, __ATOMIC_RELAXED);
    return status;
}

int dav1d_send_data(void *context, void *data) {
    static Call call[2];
    int reader = reader_of(__builtin_return_address(0));
    if (!call[reader]) call[reader] = (Call)real("dav1d_send_data", reader);
    return timed(call[reader], context, data, reader, 0);
}

int dav1d_get_picture(void *context, void *picture) {
    static Call call[2];
    int reader = reader_of(__builtin_return_address(0));
    if (!call[reader]) call[reader] = (Call)real("dav1d_get_picture", reader);
    return timed(call[reader], context, picture, reader, 1);
}

/* for ctypes: reset, then read per reader (0: ours, 1: KohakuClip 1.0.0) */
void dav1d_time_reset(void) {
    memset(calls, 0, sizeof calls);
    memset(pictures, 0, sizeof pictures);
    memset(nanoseconds, 0, sizeof nanoseconds);
}
double dav1d_time_ms(int reader) { return nanoseconds[reader] / 1e6; }
long dav1d_time_sends(int reader) { return calls[reader]; }
long dav1d_time_pictures(int reader) { return pictures[reader]; }
