/*
 * qvattn — command-line front end of the library.
 *
 *   qvattn eval           accuracy of each method against exact attention
 *   qvattn bench          timing of qva_attention
 *   qvattn info           build, backends and per-method capabilities
 *   qvattn sweep-vsmooth  V-Smooth clusters x iterations, measured
 *
 * Exit codes: 0 success, 1 runtime error (bad file, library failure),
 * 2 usage error (unknown flag, method or preset, inconsistent arguments).
 * docs/CLI.md documents every flag and the JSON schemas.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const char USAGE_MAIN[] =
    "usage: qvattn <command> [options]\n"
    "\n"
    "commands:\n"
    "  eval           accuracy of each method against exact attention\n"
    "  bench          time qva_attention (median of --iters runs)\n"
    "  info           version, build, backends, method capabilities\n"
    "  sweep-vsmooth  V-Smooth k-means clusters x iterations sweep\n"
    "\n"
    "'qvattn <command> --help' describes each command's options.\n";

static const struct command {
    const char *name;
    int (*run)(int argc, char **argv);
} COMMANDS[] = {{"eval", cmd_eval},
                {"bench", cmd_bench},
                {"info", cmd_info},
                {"sweep-vsmooth", cmd_sweep_vsmooth}};

static int asks_for_help(const char *arg) {
    return !strcmp(arg, "--help") || !strcmp(arg, "-h") || !strcmp(arg, "help");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(USAGE_MAIN, stderr);
        return RC_USAGE;
    }
    if (asks_for_help(argv[1])) {
        fputs(USAGE_MAIN, stdout);
        return RC_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("qvattn %d.%d.%d\n", QVA_VERSION_MAJOR, QVA_VERSION_MINOR,
               QVA_VERSION_PATCH);
        return RC_OK;
    }
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; ++i)
        if (!strcmp(argv[1], COMMANDS[i].name)) {
            cli_set_command(COMMANDS[i].name);
            return COMMANDS[i].run(argc, argv);
        }
    fprintf(stderr, "qvattn: unknown command '%s'\n\n%s", argv[1], USAGE_MAIN);
    return RC_USAGE;
}
