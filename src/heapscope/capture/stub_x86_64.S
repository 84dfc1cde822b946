/* The call stub heapscope places in a process it attaches to (x86-64, GNU as).
 *
 * heapscope never runs an allocator call while it holds the process. Instead, while one thread
 * is stopped, it writes this stub into the unused tail of one code page (the bytes after the
 * end of a code segment, which no code of the program reaches; written once, never changed
 * after), writes the calls to make into a data block below that thread's stack pointer, and
 * changes the thread's instruction pointer to `entry` as the very last step. It then lets the
 * thread go. The thread runs the stub as ordinary code of the process: it saves every register
 * and the whole extended (x87/SSE/AVX) state, makes the mallctl calls, copies their results
 * into a results area (the unused tail of a writable page), restores everything and jumps back
 * to where it was stopped. Signals, or a heapscope that dies at any moment, cannot leave the
 * thread anywhere but in its own code: until the instruction pointer changes nothing has
 * changed, and after it the stub needs nothing from outside. Everything that belongs to one
 * call (where to return, where the results go) is in that call's data block, so calls on two
 * threads never share anything but the results area.
 *
 * A thread stopped inside a system call that the kernel restarts (ERESTART*) resumes at
 * `restart` (entry - 2: the kernel moves the instruction pointer back over the 2-byte
 * `syscall` and puts the call number back in rax); the stub then returns to the original
 * address - 2, so the system call runs again exactly as the kernel would have restarted it.
 *
 * Layout (offsets are what heapscope/capture/stub.py relies on):
 *   code area:    +0 magic, +14 restart, +16 entry
 *   results area: +0 magic, +8 started sequence number, +16 done sequence number, +24 pid,
 *                 +32 tid (the stub writes these), +40 pointed sequence number, +48 when
 *                 (CLOCK_MONOTONIC ns; heapscope writes these before pointing a thread), +64
 *                 one 16-byte record per call (return value, first 8 bytes of the value read)
 *   data block:   at stack pointer - 128 (red zone) - DATA: +0 sequence number, +8 pid,
 *                 +16 tid, +24 resume address, +32 resume address - 2, +40 results area
 *                 address, +64 calls of 56 bytes (function, five arguments, record index),
 *                 ended by a zero function; names and buffers after them
 *
 * Regenerate the bytes in stub.py with `python -m heapscope.capture.stub --assemble` (needs
 * GNU as and objcopy); a test checks that they match this source.
 */
        .intel_syntax noprefix
        .text
        .set DATA, 8192          /* data block size, below the red zone */
        .set XAREA, 16384        /* room for XSAVE (AVX-512 needs 2.7 KiB, AMX 11 KiB) */

magic:          .ascii "HSCPSTB2"
        .byte 0x66, 0x90, 0x66, 0x90, 0x66, 0x90   /* never executed: pads to `restart` */
restart:
        jmp short entry_restart
entry:
        lea rsp, [rsp - (128 + DATA)]     /* lea: the flags are still the thread's */
        push qword ptr [rsp + 24]         /* the address is taken before the push */
        jmp short common
entry_restart:
        lea rsp, [rsp - (128 + DATA)]
        push qword ptr [rsp + 32]
common:
        pushfq
        push rax
        push rcx
        push rdx
        push rbx
        push rbp
        push rsi
        push rdi
        push r8
        push r9
        push r10
        push r11
        push r12
        push r13
        push r14
        push r15
        cld                               /* the ABI wants DF clear at a call */
        mov rbx, rsp                      /* the saved registers */
        lea rbp, [rsp + 136]              /* the data block: 17 quadwords above */
        mov r14, [rbp + 40]
        mov rax, [rbp + 8]
        mov [r14 + 24], rax               /* pid, tid: whose call this is */
        mov rax, [rbp + 16]
        mov [r14 + 32], rax
        mov rax, [rbp]
        mov [r14 + 8], rax                /* started */
        and rsp, -64
        sub rsp, XAREA
        xor eax, eax                      /* XRSTOR wants a clean XSAVE header */
        mov [rsp + 512], rax
        mov [rsp + 520], rax
        mov [rsp + 528], rax
        mov [rsp + 536], rax
        mov [rsp + 544], rax
        mov [rsp + 552], rax
        mov [rsp + 560], rax
        mov [rsp + 568], rax
        mov eax, -1
        mov edx, -1
        xsave64 [rsp]
        mov r12, rsp
        lea r13, [rbp + 64]
1:
        mov rax, [r13]
        test rax, rax
        jz 3f
        mov rdi, [r13 + 8]
        mov rsi, [r13 + 16]
        mov rdx, [r13 + 24]
        mov rcx, [r13 + 32]
        mov r8, [r13 + 40]
        call rax
        mov r15, [r13 + 48]
        shl r15, 4
        add r15, r14
        mov [r15 + 64], rax               /* return value */
        mov rcx, [r13 + 16]
        test rcx, rcx
        jz 2f
        mov rcx, [rcx]
        mov [r15 + 72], rcx               /* what was read */
2:
        add r13, 56
        jmp 1b
3:
        mov rax, [rbp]
        mov [r14 + 16], rax               /* done */
        mov eax, -1
        mov edx, -1
        xrstor64 [r12]
        mov rsp, rbx
        pop r15
        pop r14
        pop r13
        pop r12
        pop r11
        pop r10
        pop r9
        pop r8
        pop rdi
        pop rsi
        pop rbp
        pop rbx
        pop rdx
        pop rcx
        pop rax
        popfq
        ret 128 + DATA                    /* to the resume address, stack pointer as it was */
