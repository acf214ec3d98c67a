// SPDX-License-Identifier: MIT
// A foreign ZeroMQ peer against a running job's control plane (control_plane_test.sh): for
// SECONDS it keeps connected to rank 0's command and heartbeat endpoints as a DEALER and a PULL
// without credentials, as a DEALER with a wrong secret, and as a raw TCP client sending junk,
// and counts every message it receives. A control plane that admits only the job's ranks gives
// it none. Prints "intruder: N message(s) received"; exits 0 when N is 0.
// usage: zmq_intruder HOST COMMAND_PORT BEAT_PORT SECONDS
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *sock(void *ctx, int type, const char *ep, const char *password) {
  void *s = zmq_socket(ctx, type);
  int zero = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  if (password) {
    zmq_setsockopt(s, ZMQ_PLAIN_USERNAME, "lockstep", 8);
    zmq_setsockopt(s, ZMQ_PLAIN_PASSWORD, password, strlen(password));
  }
  if (zmq_connect(s, ep) != 0) {
    fprintf(stderr, "intruder: connect %s: %s\n", ep, zmq_strerror(zmq_errno()));
    exit(2);
  }
  return s;
}

// A raw TCP client that sends junk and closes (a port scanner, a stray HTTP request).
static void junk(const char *host, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((unsigned short)port);
  inet_pton(AF_INET, host, &a.sin_addr);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
    const char *req = "GET / HTTP/1.0\r\n\r\n";
    if (write(fd, req, strlen(req)) < 0) perror("intruder: write");
  }
  close(fd);
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: zmq_intruder HOST COMMAND_PORT BEAT_PORT SECONDS\n");
    return 2;
  }
  const char *host = argv[1];
  int cport = atoi(argv[2]), bport = atoi(argv[3]);
  double secs = atof(argv[4]);
  char cep[128], bep[128];
  snprintf(cep, sizeof cep, "tcp://%s:%d", host, cport);
  snprintf(bep, sizeof bep, "tcp://%s:%d", host, bport);
  void *ctx = zmq_ctx_new();
  void *s[4] = {sock(ctx, ZMQ_DEALER, cep, NULL), sock(ctx, ZMQ_PULL, bep, NULL),
                sock(ctx, ZMQ_DEALER, cep, "not-the-secret"), sock(ctx, ZMQ_PULL, bep, "0123")};
  // Something a worker might send: a hello-like frame, and junk.
  zmq_send(s[0], "\x08\x01", 2, ZMQ_DONTWAIT);
  zmq_send(s[2], "junk", 4, ZMQ_DONTWAIT);
  long got = 0;
  double end = now() + secs, next_junk = 0;
  while (now() < end) {
    if (now() > next_junk) {
      junk(host, cport);
      junk(host, bport);
      next_junk = now() + 0.5;
    }
    zmq_pollitem_t it[4];
    for (int i = 0; i < 4; i++) it[i] = (zmq_pollitem_t){s[i], 0, ZMQ_POLLIN, 0};
    if (zmq_poll(it, 4, 100) <= 0) continue;
    for (int i = 0; i < 4; i++) {
      char b[4096];
      while (zmq_recv(s[i], b, sizeof b, ZMQ_DONTWAIT) >= 0) got++;
    }
  }
  for (int i = 0; i < 4; i++) zmq_close(s[i]);
  zmq_ctx_term(ctx);
  printf("intruder: %ld message(s) received\n", got);
  return got == 0 ? 0 : 1;
}
