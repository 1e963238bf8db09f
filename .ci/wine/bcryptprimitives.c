/* bcryptprimitives.dll for Wine 8, which does not ship it.
 *
 * Rust's std on Windows (1.78+) imports ProcessPrng from
 * bcryptprimitives.dll for its hash map keys; Wine 9 has the DLL, the
 * Wine 8 in Debian 12 does not, and every Rust test binary then fails to
 * load (status c0000135). This shim answers ProcessPrng with
 * RtlGenRandom (advapi32's SystemFunction036). Test runs only: it is
 * copied into the Wine prefix by .ci/run, never shipped.
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG chunk = len > 0x10000000 ? 0x10000000 : (ULONG)len;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        len -= chunk;
    }
    return TRUE;
}
