;;; emacs_packages.el --- put packages installed outside Emacs on the load path  -*- lexical-binding: t -*-

;; Loaded first by the e2e scripts, which run under `emacs --batch -Q': -Q skips site-start, so packages
;; installed by Debian (elpa-eglot on Emacs 28, elpa-lsp-mode, elpa-company) or by package.el are not on
;; the load path (Emacs 29+ has eglot built in). Put first, as package.el would.

(dolist (dir (append (file-expand-wildcards "/usr/share/emacs/site-lisp/elpa/*")
                     (file-expand-wildcards (expand-file-name "~/.emacs.d/elpa/*"))))
  (when (file-directory-p dir)
    (add-to-list 'load-path dir)))

;;; emacs_packages.el ends here
