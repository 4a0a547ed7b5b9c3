/* The stand-in commands' client, compiled (simhost/standins/relayclient.py builds it once per
 * machine): what simhost/bin/_relay.py does, without starting an interpreter.
 *
 * A host's bin/<name> links here. It sends the host's init (its pid in $SIMHOST_DIR/state/init.pid,
 * listening on the abstract socket "simhost-relay-<pid>") the request _relay.encode makes:
 * name, argc, argv, cwd, umask, environment, NUL-separated after an 8-byte big-endian length,
 * with fds 0-2 attached (SCM_RIGHTS). Init answers "-" when the command is not one it runs
 * (_relay.relayable), else the command's pid, then its exit status (negative: the signal that
 * killed it), one line each. Not relayed, or no init answering: this process becomes
 * `python -S -E simhost/bin/<name> ARGS`, as the host's shell wrapper would start it.
 *
 * SIMHOST_PYTHON and SIMHOST_BIN_DIR are given when it is compiled.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

extern char **environ;

static volatile pid_t child = 0;

static void forward(int signum) {
    if (child > 0) kill(child, signum);
}

static const char *name_of(const char *argv0) {
    const char *slash = strrchr(argv0, '/');
    return slash ? slash + 1 : argv0;
}

/* Run the stand-in in this process instead (never returns). */
static void alone(const char *name, int argc, char **argv) {
    char script[4096];
    char **args = calloc((size_t)argc + 4, sizeof(char *));
    if (args == NULL || snprintf(script, sizeof script, "%s/%s", SIMHOST_BIN_DIR, name)
                            >= (int)sizeof script) {
        fputs("simhost: command name too long\n", stderr);
        exit(127);
    }
    args[0] = SIMHOST_PYTHON;
    args[1] = "-S";
    args[2] = "-E";
    args[3] = script;
    for (int i = 1; i < argc; i++) args[i + 3] = argv[i];
    execv(SIMHOST_PYTHON, args);
    fprintf(stderr, "simhost: cannot start %s: %s\n", SIMHOST_PYTHON, strerror(errno));
    exit(127);
}

/* Append `len` bytes and a NUL separator (none before the first field). */
static int put(char **buf, size_t *used, size_t *cap, const char *s, size_t len) {
    size_t need = *used + len + 1;
    if (need > *cap) {
        size_t grown = *cap * 2 > need ? *cap * 2 : need;
        char *bigger = realloc(*buf, grown);
        if (bigger == NULL) return -1;
        *buf = bigger;
        *cap = grown;
    }
    if (*used > 0) (*buf)[(*used)++] = '\0';
    memcpy(*buf + *used, s, len);
    *used += len;
    return 0;
}

static int init_pid(void) {
    const char *host = getenv("SIMHOST_DIR");
    char path[4096], text[32];
    if (host == NULL || !*host) return -1;
    if (snprintf(path, sizeof path, "%s/state/init.pid", host) >= (int)sizeof path) return -1;
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    int pid = atoi(text);
    return pid > 0 ? pid : -1;
}

/* Connect to init and send the request; the socket, or -1 when init cannot take it. */
static int send_request(int pid, const char *name, int argc, char **argv) {
    char *body = NULL, number[32], cwd[4096];
    size_t used = 0, cap = 0;
    mode_t mask = umask(0);
    umask(mask);
    if (getcwd(cwd, sizeof cwd) == NULL) return -1;
    snprintf(number, sizeof number, "%d", argc - 1);
    int failed = put(&body, &used, &cap, name, strlen(name)) ||
                 put(&body, &used, &cap, number, strlen(number));
    for (int i = 1; i < argc && !failed; i++) failed = put(&body, &used, &cap, argv[i], strlen(argv[i]));
    snprintf(number, sizeof number, "%u", (unsigned)mask);
    failed = failed || put(&body, &used, &cap, cwd, strlen(cwd)) ||
             put(&body, &used, &cap, number, strlen(number));
    for (char **e = environ; *e && !failed; e++)
        if (strchr(*e, '=') != NULL) failed = put(&body, &used, &cap, *e, strlen(*e));
    if (failed) {
        free(body);
        return -1;
    }

    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int len = snprintf(addr.sun_path + 1, sizeof addr.sun_path - 1, "simhost-relay-%d", pid);
    if (sock < 0 || connect(sock, (struct sockaddr *)&addr,
                            (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len)) != 0) {
        if (sock >= 0) close(sock);
        free(body);
        return -1;
    }
    unsigned char header[8];
    for (int i = 0; i < 8; i++) header[i] = (unsigned char)((uint64_t)used >> (56 - 8 * i));
    int fds[3] = {0, 1, 2};
    char control[CMSG_SPACE(sizeof fds)];
    memset(control, 0, sizeof control);
    struct iovec iov[2] = {{header, sizeof header}, {body, used}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2, .msg_control = control,
                         .msg_controllen = sizeof control};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cmsg), fds, sizeof fds);
    ssize_t sent = sendmsg(sock, &msg, MSG_NOSIGNAL);
    size_t total = sent < 0 ? 0 : (size_t)sent;
    /* The rest of a long request (a big environment), without the descriptors again. */
    while (sent >= 0 && total < sizeof header + used) {
        size_t off = total - sizeof header;
        sent = send(sock, body + off, used - off, MSG_NOSIGNAL);
        if (sent > 0) total += (size_t)sent;
        else if (sent < 0 && errno == EINTR) sent = 0;
    }
    free(body);
    if (sent < 0) {
        close(sock);
        return -1;
    }
    return sock;
}

/* The next line from init ("" at its end): 1, or 0 when the connection ended first. */
static int read_line(int sock, char *line, size_t size) {
    size_t n = 0;
    while (n + 1 < size) {
        ssize_t got = read(sock, line + n, 1);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return 0;
        if (line[n] == '\n') break;
        n++;
    }
    line[n] = '\0';
    return 1;
}

int main(int argc, char **argv) {
    const char *name = name_of(argv[0]);
    int pid = init_pid();
    int sock = pid > 0 ? send_request(pid, name, argc, argv) : -1;
    char line[64];
    if (sock < 0) alone(name, argc, argv);
    struct sigaction pass = {.sa_handler = forward};
    sigemptyset(&pass.sa_mask);
    int passed[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
    for (size_t i = 0; i < sizeof passed / sizeof passed[0]; i++) sigaction(passed[i], &pass, NULL);
    if (!read_line(sock, line, sizeof line)) {
        close(sock);
        alone(name, argc, argv); /* init ended before it took the command */
    }
    if (strcmp(line, "-") == 0) { /* not a command init runs */
        close(sock);
        alone(name, argc, argv);
    }
    child = (pid_t)atoi(line);
    if (!read_line(sock, line, sizeof line)) {
        fputs("simhost: the host's init stopped while running the command\n", stderr);
        return 255;
    }
    close(sock);
    int status = atoi(line);
    if (status < 0) { /* killed by a signal: end the same way, as the shell then sees it */
        signal(-status, SIG_DFL);
        kill(getpid(), -status);
        return 128 - status;
    }
    return status;
}
