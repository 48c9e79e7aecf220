;;; eglot_check.el --- attach backward-explainer's server to a buffer with eglot, report diagnostics
;; Run: emacs --batch -Q -l tests/editors/eglot_check.el FILE
;; Environment: EXPLAINER_SERVER (the backward-explainer-lsp command), EXPLAINER_OUT (report file).
;; -Q skips the site setup: put Debian's elpa-eglot (and the newer project/xref it needs) on the path.
(dolist (dir (file-expand-wildcards "/usr/share/emacs/site-lisp/elpa/*"))
  (add-to-list 'load-path dir))
(require 'eglot)
(require 'flymake)
(require 'python)
(let* ((server (or (getenv "EXPLAINER_SERVER") "backward-explainer-lsp"))
       (out (getenv "EXPLAINER_OUT"))
       (file (car command-line-args-left))
       (report '()))
  ;; The documented config (docs/editors.md), with this test's server command.
  (add-to-list 'eglot-server-programs `((python-mode python-ts-mode) . (,server)))
  (find-file file)
  (python-mode)
  (apply #'eglot--connect (eglot--guess-contact))  ; what eglot-ensure does after the next command
  (flymake-mode 1)
  (let ((deadline (+ (float-time) 60)))
    (while (and (null (flymake-diagnostics)) (< (float-time) deadline))
      (flymake-start)
      (accept-process-output nil 0.2)))
  (dolist (d (flymake-diagnostics))
    (save-excursion
      (goto-char (flymake-diagnostic-beg d))
      (push (format "before %d:%d %s" (line-number-at-pos) (1+ (current-column))
                    (flymake-diagnostic-text d))
            report)))
  ;; Apply the quick fix at the first diagnostic through eglot's own code-action machinery.
  (let* ((first (car (flymake-diagnostics)))
         (line (and first (save-excursion (goto-char (flymake-diagnostic-beg first)) (line-number-at-pos)))))
    (when first
      (let* ((actions (jsonrpc-request (eglot-current-server) :textDocument/codeAction
                                       (list :textDocument (eglot--TextDocumentIdentifier)
                                             :range (list :start (eglot--pos-to-lsp-position (flymake-diagnostic-beg first))
                                                          :end (eglot--pos-to-lsp-position (flymake-diagnostic-end first)))
                                             :context (list :diagnostics [] :only ["quickfix"]))))
             (action (and (> (length actions) 0) (aref actions 0))))
        (when action
          (eglot--apply-workspace-edit (plist-get action :edit))
          (push (format "applied %s" (plist-get action :title)) report)))
      (let ((deadline (+ (float-time) 60)))
        (while (and (< (float-time) deadline)
                    (seq-some (lambda (d) (= line (save-excursion (goto-char (flymake-diagnostic-beg d))
                                                                  (line-number-at-pos))))
                              (flymake-diagnostics)))
          (eglot--signal-textDocument/didChange)  ; an idle timer sends it interactively
          (flymake-start)
          (accept-process-output nil 0.2)))
      (dolist (d (flymake-diagnostics))
        (push (format "after %d %s" (save-excursion (goto-char (flymake-diagnostic-beg d)) (line-number-at-pos))
                      (flymake-diagnostic-text d))
              report))
      (push (format "text %s" (save-excursion (goto-char (point-min)) (forward-line (1- line))
                                              (buffer-substring (line-beginning-position) (line-end-position))))
            report)))
  (with-temp-file out (insert (mapconcat #'identity (nreverse report) "\n") "\n"))
  (ignore-errors (eglot-shutdown (eglot-current-server)))
  (kill-emacs 0))
