from aggdec.cli import main

raise SystemExit(main())
