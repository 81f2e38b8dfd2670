/* tools/commands.h -- the radix CLI's subcommands, one function each, in
 * their own .c files under tools/.  Each returns the process exit status
 * (0 ok, 1 failure, 2 usage).  argv[0] is the subcommand name. */
#ifndef RX_COMMANDS_H
#define RX_COMMANDS_H

int rx_cmd_gguf_gen (int argc, char **argv);   /* tools/gguf_gen.c */
int rx_cmd_tokenize (int argc, char **argv);   /* tools/tokenize.c */
int rx_cmd_generate (int argc, char **argv);   /* tools/generate.c */
int rx_cmd_chat (int argc, char **argv);       /* tools/chat.c */
int rx_cmd_bench (int argc, char **argv);      /* tools/bench.c */
int rx_cmd_eplb (int argc, char **argv);       /* tools/eplb.c */

#endif
