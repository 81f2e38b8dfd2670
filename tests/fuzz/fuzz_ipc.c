/* tests/fuzz/fuzz_ipc.c -- libFuzzer harness for the IPC message decoder
 * (core/ipc_msg.c).
 *
 * Every input must either decode -- and then it is a valid message: it
 * re-encodes to exactly the input bytes (the format is canonical) and frees
 * cleanly -- or be refused with RX_EFORMAT and one line starting
 * "ipc message: ".  ASan/UBSan catch any read outside the input.  Build and
 * run with tests/fuzz/run.sh ipc; seeds in tests/fuzz/corpus/ipc. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ipc_msg.h"

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    struct rx_err err = { 0 };
    struct rx_ipc_msg m;
    int rc = rx_ipc_decode (data, size, &m, &err);
    if (rc == RX_OK) {
        uint8_t *buf = NULL;
        size_t len = 0;
        struct rx_err e2 = { 0 };
        if (rx_ipc_encode (&m, &buf, &len, &e2) != RX_OK) {
            fprintf (stderr, "decoded %s does not re-encode: %s\n", rx_ipc_type_name (m.type),
                     e2.msg);
            abort ();
        }
        if (len != size || memcmp (buf, data, size) != 0) {
            fprintf (stderr, "decoded %s re-encodes to different bytes (%zu vs %zu)\n",
                     rx_ipc_type_name (m.type), len, size);
            abort ();
        }
        free (buf);
        rx_ipc_msg_free (&m);
        if (m.type != 0) abort ();
    } else if (rc != RX_EFORMAT || err.code != RX_EFORMAT
               || strncmp (err.msg, "ipc message: ", 13) != 0 || strlen (err.msg) < 20
               || strchr (err.msg, '\n') || m.type != 0) {
        fprintf (stderr, "refused without a proper message: code %d \"%s\"\n", rc, err.msg);
        abort ();
    }
    return 0;
}
