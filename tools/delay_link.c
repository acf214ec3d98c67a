// SPDX-License-Identifier: MIT
//
// delay_link -- a network link with a fixed one-way delay between two network namespaces, for
// kernels without `tc netem` (tools/netem_lib.sh falls back to it). It makes a TAP interface in
// each namespace and forwards every Ethernet frame from one to the other DELAY_US microseconds
// after it arrived, in order, like a cable of that latency. On SIGTERM or SIGINT it prints, per
// direction, the frames forwarded and the least, median and 99th percentile of the delay each frame
// really had (arrival at the forwarder to its write to the other side).
//
//   delay_link NETNS_A DEV_A NETNS_B DEV_B DELAY_US
//
// Root only. It prints "ready" once both interfaces exist; the caller then gives them addresses
// and brings them up (`ip -n NETNS_A addr add ... dev DEV_A`, `ip ... link set DEV_A up`).

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

enum { QUEUE = 4096, FRAME = 2048, SAMPLES = 1 << 16 };

typedef struct {
  int64_t due_ns, arrived_ns;
  int len;
  unsigned char data[FRAME];
} frame;

// One direction: frames read from `from`, written to `to` when due.
typedef struct {
  int from, to;
  frame *q;
  int head, count;
  long forwarded, dropped;
  int32_t *took_us;  // real delay of the first SAMPLES frames, for the report
} direction;

static volatile sig_atomic_t stop;

static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

// A TAP interface called `dev` in network namespace `netns` (a name under /run/netns).
static int open_tap(const char *netns, const char *dev) {
  char path[256];
  snprintf(path, sizeof path, "/run/netns/%s", netns);
  int nsfd = open(path, O_RDONLY | O_CLOEXEC);
  if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) {
    fprintf(stderr, "delay_link: cannot enter network namespace %s: %s\n", netns,
            strerror(errno));
    exit(1);
  }
  close(nsfd);
  int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  struct ifreq ifr = {.ifr_flags = IFF_TAP | IFF_NO_PI};
  snprintf(ifr.ifr_name, IFNAMSIZ, "%s", dev);
  if (fd < 0 || ioctl(fd, TUNSETIFF, &ifr) != 0) {
    fprintf(stderr, "delay_link: cannot make TAP %s in %s: %s\n", dev, netns, strerror(errno));
    exit(1);
  }
  return fd;
}

// Reads every frame waiting on d->from into the queue, due delay_ns from now.
static void take(direction *d, int64_t delay_ns) {
  for (;;) {
    frame *f = &d->q[(d->head + d->count) % QUEUE];
    unsigned char scratch[FRAME];
    int full = d->count == QUEUE;
    ssize_t n = read(d->from, full ? scratch : f->data, FRAME);
    if (n <= 0) return;
    if (full) {  // a link's queue overflows: the frame is lost, as on a real one
      d->dropped++;
      continue;
    }
    f->arrived_ns = now_ns();
    f->due_ns = f->arrived_ns + delay_ns;
    f->len = (int)n;
    d->count++;
  }
}

// Writes the frames that are due; returns the time the next one is due (or INT64_MAX).
static int64_t give(direction *d, int64_t now) {
  while (d->count > 0) {
    frame *f = &d->q[d->head];
    if (f->due_ns > now) return f->due_ns;
    if (write(d->to, f->data, (size_t)f->len) < 0 && errno == EAGAIN) return now;
    if (d->forwarded < SAMPLES)
      d->took_us[d->forwarded] = (int32_t)((now_ns() - f->arrived_ns) / 1000);
    d->forwarded++;
    d->head = (d->head + 1) % QUEUE;
    d->count--;
  }
  return INT64_MAX;
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

static void report(const char *name, direction *d) {
  long n = d->forwarded < SAMPLES ? d->forwarded : SAMPLES;
  if (n == 0) {
    fprintf(stderr, "delay_link: %s: no frames\n", name);
    return;
  }
  qsort(d->took_us, (size_t)n, sizeof *d->took_us, cmp_i32);
  fprintf(stderr,
          "delay_link: %s: %ld frames, %ld dropped, delay min %d us, median %d us, p99 %d us\n",
          name, d->forwarded, d->dropped, d->took_us[0], d->took_us[n / 2],
          d->took_us[n * 99 / 100]);
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: delay_link NETNS_A DEV_A NETNS_B DEV_B DELAY_US\n");
    return 2;
  }
  char *end;
  long delay_us = strtol(argv[5], &end, 10);
  if (*end || delay_us < 0 || delay_us > 1000000) {
    fprintf(stderr, "delay_link: DELAY_US must be 0..1000000 microseconds, not '%s'\n", argv[5]);
    return 2;
  }
  int a = open_tap(argv[1], argv[2]), b = open_tap(argv[3], argv[4]);
  direction d[2] = {{.from = a, .to = b}, {.from = b, .to = a}};
  for (int i = 0; i < 2; i++) {
    d[i].q = malloc(sizeof(frame) * QUEUE);
    d[i].took_us = malloc(sizeof(int32_t) * SAMPLES);
    if (!d[i].q || !d[i].took_us) {
      fprintf(stderr, "delay_link: out of memory\n");
      return 1;
    }
  }
  prctl(PR_SET_TIMERSLACK, 1UL);  // wake within a microsecond of the due time, not 50
  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  printf("ready\n");
  fflush(stdout);
  int64_t delay_ns = delay_us * 1000;
  while (!stop) {
    int64_t now = now_ns();
    int64_t next = give(&d[0], now), n1 = give(&d[1], now);
    if (n1 < next) next = n1;
    struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
    struct timespec wait = {1, 0};
    if (next != INT64_MAX) {
      int64_t w = next - now_ns();
      if (w < 0) w = 0;
      wait = (struct timespec){w / 1000000000, w % 1000000000};
    }
    if (ppoll(p, 2, &wait, NULL) < 0 && errno != EINTR) {
      perror("delay_link: ppoll");
      return 1;
    }
    take(&d[0], delay_ns);
    take(&d[1], delay_ns);
  }
  char ab[64], ba[64];
  snprintf(ab, sizeof ab, "%s -> %s", argv[2], argv[4]);
  snprintf(ba, sizeof ba, "%s -> %s", argv[4], argv[2]);
  report(ab, &d[0]);
  report(ba, &d[1]);
  return 0;
}
